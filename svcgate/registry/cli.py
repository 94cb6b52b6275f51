"""``svcgate registry keygen|sign|verify|pin-tools``: run your own signed index.

- ``keygen KEY``: a new Ed25519 private key at ``KEY`` (mode 0600, never overwritten) and its
  public key at ``KEY.pub``; prints the public key line for ``SVC_REGISTRY_KEYS``.
- ``sign --key KEY [--key KEY2] INDEX``: checks the index against the schema first (a
  malformed index is not signed; refused entries and an expiry in the past are reported),
  then writes the detached signature ``INDEX.sig`` (or ``--out``).
- ``verify --key PUB [...] INDEX``: what the gateway does before an install: verify the
  signature over the exact bytes, parse, and print the version, expiry and releases. Keys
  are ``ed25519:...`` values or files of them; ``SVC_REGISTRY_KEYS`` is the default.
- ``pin-tools [FILE]``: reads a ``tools/list`` result (``{"tools": [...]}`` or the bare
  list) from FILE or stdin and prints the manifest ``tools`` entries with their hashes.

Exit status 0 on success, 1 with one line on stderr otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

from svcgate.registry import signing
from svcgate.registry.index import IndexFormatError, parse_index, parse_version
from svcgate.registry.toolpins import pins_for


class _Fail(Exception):
    pass


def _read(path: str) -> bytes:
    try:
        return sys.stdin.buffer.read() if path == "-" else Path(path).read_bytes()
    except OSError as exc:
        raise _Fail(f"cannot read {path} ({exc.strerror})") from None


def _keys(values: list[str] | None) -> list[signing.PublicKey]:
    items = values or [
        item for item in os.environ.get("SVC_REGISTRY_KEYS", "").split(",") if item.strip()
    ]
    if not items:
        raise _Fail("name a trusted key with --key (or set SVC_REGISTRY_KEYS)")
    lines: list[str] = []
    for item in items:
        item = item.strip()
        if item.startswith(signing.PREFIX):
            lines.append(item)
        else:
            lines.extend(_read(item).decode("utf-8", "replace").splitlines())
    try:
        return signing.parse_public_keys(lines)
    except signing.SignatureError as exc:
        raise _Fail(str(exc)) from None


def _summary(data: bytes) -> list[str]:
    try:
        index = parse_index(data)
    except IndexFormatError as exc:
        raise _Fail(f"the index is malformed: {exc}") from None
    lines = [f"index version {index.version}, expires {index.expires.isoformat()}"]
    if index.expires <= datetime.now(UTC):
        lines.append("WARNING: the index has expired; gateways will refuse it")
    for name in sorted(index.releases):
        versions = sorted(index.releases[name], key=parse_version)
        lines.append(f"  {name}: {', '.join(versions) or '(no usable version)'}")
    for key, problem in sorted(index.errors.items()):
        lines.append(f"  REFUSED {key}: {problem}")
    return lines


def cmd_keygen(args: argparse.Namespace) -> None:
    private = Path(args.key)
    public_path = Path(f"{private}.pub")
    if private.exists() or public_path.exists():
        raise _Fail(f"{private} or {public_path} already exists; not overwriting")
    try:
        public = signing.generate(private)
        public_path.write_text(public.text() + "\n")
    except OSError as exc:
        raise _Fail(f"cannot write the key ({exc.strerror})") from None
    print(f"private key: {private} (keep it offline; mode 0600)")
    print(f"public key:  {public_path} (key id {public.keyid})")
    print(f"SVC_REGISTRY_KEYS={public.text()}")


def cmd_sign(args: argparse.Namespace) -> None:
    data = _read(args.index)
    for line in _summary(data):
        print(line, file=sys.stderr)
    try:
        keys = [signing.load_private_key(Path(path)) for path in args.key]
    except signing.SignatureError as exc:
        raise _Fail(str(exc)) from None
    out = Path(args.out or f"{args.index}.sig")
    try:
        out.write_bytes(signing.sign(data, keys))
    except OSError as exc:
        raise _Fail(f"cannot write {out} ({exc.strerror})") from None
    print(f"signed {args.index} -> {out}")


def cmd_verify(args: argparse.Namespace) -> None:
    data = _read(args.index)
    signature = _read(args.sig or f"{args.index}.sig")
    try:
        key = signing.verify(data, signature, _keys(args.key))
    except signing.SignatureError as exc:
        raise _Fail(str(exc)) from None
    print(f"signature OK (key id {key.keyid})")
    for line in _summary(data):
        print(line)


def cmd_pin_tools(args: argparse.Namespace) -> None:
    try:
        document = json.loads(_read(args.file))
    except ValueError:
        raise _Fail("the input is not JSON") from None
    if isinstance(document, dict) and "result" in document:
        document = document["result"]
    tools = document.get("tools") if isinstance(document, dict) else document
    if not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools):
        raise _Fail('expected a tools/list result: {"tools": [...]}')
    print(json.dumps(pins_for(tools, default=not args.off), indent=2))


def add_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    registry = sub.add_parser("registry", help="keys and signatures for a registry index")
    reg_sub = registry.add_subparsers(dest="registry_command", required=True)
    keygen = reg_sub.add_parser("keygen", help="create an Ed25519 signing key pair")
    keygen.add_argument("key", help="where to write the private key (KEY.pub gets the public)")
    keygen.set_defaults(func=_wrap(cmd_keygen))
    sign = reg_sub.add_parser("sign", help="check and sign an index (writes INDEX.sig)")
    sign.add_argument("index")
    sign.add_argument("--key", action="append", required=True, help="private key file")
    sign.add_argument("--out", help="signature file (default INDEX.sig)")
    sign.set_defaults(func=_wrap(cmd_sign))
    verify = reg_sub.add_parser("verify", help="verify and summarise an index")
    verify.add_argument("index")
    verify.add_argument("--sig", help="signature file (default INDEX.sig)")
    verify.add_argument(
        "--key", action="append", help="trusted public key or key file (default SVC_REGISTRY_KEYS)"
    )
    verify.set_defaults(func=_wrap(cmd_verify))
    pin = reg_sub.add_parser("pin-tools", help="manifest tool pins for a tools/list result")
    pin.add_argument("file", nargs="?", default="-")
    pin.add_argument("--off", action="store_true", help="mark the tools default: false")
    pin.set_defaults(func=_wrap(cmd_pin_tools))


def _wrap(command: Callable[[argparse.Namespace], None]) -> Callable[[argparse.Namespace], int]:
    def run(args: argparse.Namespace) -> int:
        try:
            command(args)
        except _Fail as exc:
            print(f"svcgate: {exc}", file=sys.stderr)
            return 1
        return 0

    return run
