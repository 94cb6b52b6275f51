"""Post-login redirect targets (pure): only same-origin relative paths survive (THREATS.md B4)."""

from __future__ import annotations

from urllib.parse import unquote, urlsplit

MAX_NEXT = 512


def safe_next(candidate: str | None) -> str:
    """Return ``candidate`` if it is a same-origin absolute path, else ``"/"``.

    Refused: scheme-relative ``//host``, ``/\\host`` (browsers treat ``\\`` as ``/``),
    anything with a scheme or authority, control characters, and encoded forms of those.
    """
    if not candidate or len(candidate) > MAX_NEXT:
        return "/"
    if not candidate.startswith("/"):
        return "/"
    # Check the raw and the (repeatedly) percent-decoded forms: a later hop may decode again.
    forms = [candidate]
    decoded = candidate
    for _ in range(3):
        decoded = unquote(decoded)
        forms.append(decoded)
    for form in forms:
        if any(ord(c) < 0x20 or ord(c) == 0x7F for c in form):
            return "/"
        if "\\" in form:
            return "/"
        if form.startswith("//"):
            return "/"
        parts = urlsplit(form)
        if parts.scheme or parts.netloc:
            return "/"
    return candidate
