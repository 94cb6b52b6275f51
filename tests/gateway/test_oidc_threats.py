"""THREATS.md B1-B3 through the real identity provider: forged, replayed and injected flows."""

from __future__ import annotations

from urllib.parse import parse_qsl, urlencode, urlsplit

import httpx2
import pytest
from gateway_support import Gateway, api, authorize, begin_login, finish_login, login, start_gateway

from devidp.provider import DevIdP


def _no_session(result_response: httpx2.Response) -> None:
    assert result_response.status_code == 401, result_response.text
    assert result_response.json()["error"]["code"] == "unauthenticated"
    assert "svc_session" not in result_response.headers.get("set-cookie", "")


def test_callback_without_the_flow_cookie_is_refused(gateway: Gateway) -> None:
    _, url = begin_login(gateway)
    _no_session(finish_login(gateway, authorize(url, "bob"), None).response)


def test_callback_with_a_wrong_state_is_refused(gateway: Gateway) -> None:
    flow, url = begin_login(gateway)
    callback = urlsplit(authorize(url, "bob"))
    params = dict(parse_qsl(callback.query))
    params["state"] = "x" * 43
    tampered = f"{callback.path}?{urlencode(params)}"
    _no_session(finish_login(gateway, tampered, flow).response)


def test_callback_replay_is_refused(gateway: Gateway) -> None:
    flow, url = begin_login(gateway)
    callback = authorize(url, "bob")
    assert finish_login(gateway, callback, flow).response.status_code == 302
    _no_session(finish_login(gateway, callback, flow).response)


def test_a_flow_cookie_from_another_gateway_process_is_refused(
    gateway: Gateway, idp: DevIdP, tmp_path
) -> None:  # type: ignore[no-untyped-def]
    other = start_gateway(tmp_path, idp=idp)
    try:
        flow, _ = begin_login(other)  # signed with the other process's key
    finally:
        other.stop()
    _, own_url = begin_login(gateway)
    callback = authorize(own_url, "bob")
    _no_session(finish_login(gateway, callback, flow).response)


def test_provider_error_in_callback_is_refused(gateway: Gateway) -> None:
    flow, url = begin_login(gateway)
    state = dict(parse_qsl(urlsplit(url).query))["state"]
    callback = f"/api/auth/callback?{urlencode({'state': state, 'error': 'access_denied'})}"
    _no_session(finish_login(gateway, callback, flow).response)


@pytest.mark.parametrize(
    "mutation",
    [
        "wrong_nonce",
        "wrong_aud",
        "aud_array_bad_azp",
        "wrong_iss",
        "expired",
        "alg_none",
        "hs256_pubkey",
        "unknown_kid",
        "bad_signature",
        "no_nonce",
    ],
)
def test_bad_id_tokens_are_refused(gateway: Gateway, idp: DevIdP, mutation: str) -> None:
    flow, url = begin_login(gateway)
    callback = authorize(url, "alice")
    idp.set_next_id_token_mutation(mutation)
    _no_session(finish_login(gateway, callback, flow).response)


def test_an_audience_array_with_our_azp_is_accepted(gateway: Gateway, idp: DevIdP) -> None:
    flow, url = begin_login(gateway)
    callback = authorize(url, "bob")
    idp.set_next_id_token_mutation("aud_array")
    result = finish_login(gateway, callback, flow)
    assert result.response.status_code == 302
    assert result.session


def test_injected_code_fails_because_pkce_binds_it_to_the_attackers_flow(
    gateway: Gateway, idp: DevIdP
) -> None:
    victim_flow, victim_url = begin_login(gateway)
    victim_state = dict(parse_qsl(urlsplit(victim_url).query))["state"]
    _, attacker_url = begin_login(gateway)
    attacker_code = dict(parse_qsl(urlsplit(authorize(attacker_url, "carol")).query))["code"]
    injected = f"/api/auth/callback?{urlencode({'code': attacker_code, 'state': victim_state})}"
    before = len(idp.token_requests())
    _no_session(finish_login(gateway, injected, victim_flow).response)
    exchanges = idp.token_requests()[before:]
    assert exchanges, "the gateway should have tried the exchange"
    assert all(req.get("code_verifier_present") for req in exchanges)
    assert all(req.get("code_challenge_method") == "S256" for req in exchanges)


def test_failed_sign_in_is_audited_without_token_material(gateway: Gateway, idp: DevIdP) -> None:
    flow, url = begin_login(gateway)
    callback = authorize(url, "bob")
    code = dict(parse_qsl(urlsplit(callback).query))["code"]
    idp.set_next_id_token_mutation("wrong_nonce")
    _no_session(finish_login(gateway, callback, flow).response)
    with api(gateway, login(gateway, "alice")) as client:
        events = client.get("/api/audit", params={"limit": 200}).json()["events"]
    failures = [e for e in events if e["decision"] == "login_failed"]
    assert failures
    assert failures[0]["kind"] == "auth"
    assert "nonce" in failures[0]["detail"]
    for event in events:
        assert code not in event["detail"]
        assert flow not in event["detail"]
    assert code not in gateway.log_text()


def test_every_callback_outcome_clears_the_flow_cookie(gateway: Gateway) -> None:
    flow, url = begin_login(gateway)
    callback = authorize(url, "bob")
    for cookie in (flow, flow, "forged.cookie"):  # success, replay, forged
        response = finish_login(gateway, callback, cookie).response
        cleared = [v for v in response.headers.get_list("set-cookie") if v.startswith("svc_flow=")]
        assert cleared, response.status_code
        assert cleared[0].startswith('svc_flow=""') or cleared[0].startswith("svc_flow=;")
