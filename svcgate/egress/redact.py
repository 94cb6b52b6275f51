"""Scrub an injected secret from response bytes before they reach the sandbox (THREATS C8).

The proxy injects a user's credential into requests toward the hosts bound to it. A host
that reflects request headers (httpbin ``/headers``, error pages quoting the request, debug
endpoints) would hand the secret straight back to the sandbox, so every response byte on
an injected tunnel passes through :class:`StreamRedactor` (bodies) or :func:`redact`
(header values).

Rules:

- :func:`secret_forms` lists every encoding of the secret that is scrubbed: raw, URL-encoded
  (``quote`` and ``quote_plus``, upper- and lower-case hex), JSON-string-escaped, and the
  base64 "stable cores" (standard and URL-safe alphabets, all three byte alignments), so
  the secret is also found inside a larger base64 blob such as HTTP Basic ``user:secret``.
  Forms shorter than 4 bytes are dropped; callers only inject non-trivial secrets.
- Every byte that lies inside *any* occurrence of *any* form (overlapping occurrences
  included) is replaced by ``*``. Replacement is byte-for-byte, so lengths never change
  and ``Content-Length`` framing stays valid.
- The streaming result is independent of how the input is chunked: the output of
  ``feed(a) + feed(b) + finish()`` equals that of ``redact(a + b)``.
- Caveat: a form that itself contains ``*`` can reappear in the output when redaction
  stars sit next to matching text (e.g. secret ``**ab`` in ``**abab`` gives ``****ab``).
  No byte of an original occurrence survives, which is what matters; a form consisting
  only of ``*`` cannot be hidden by ``*`` at all.

Resource handling: a :class:`StreamRedactor` holds back at most ``max(len(form)) - 1``
bytes, and only the suffix that could still be the start of a form split across chunks;
:meth:`StreamRedactor.finish` releases it. With no forms, :meth:`StreamRedactor.feed`
returns its input object unchanged (no copy). Searching uses ``bytes.find`` per form, so
the cost is a few C-speed passes per chunk with no per-byte Python loop on the data.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Sequence
from urllib.parse import quote, quote_plus

MIN_FORM_BYTES = 4

# base64 maps each 3-byte group to 4 characters. A secret starting at byte offset k (mod 3)
# of its group shares that group with k foreign bytes: for k=1 the first 2 characters of
# the group mix in foreign bits, for k=2 the first 3 do.
_LEAD_DROP = {0: 0, 1: 2, 2: 3}
# When the secret ends r bytes (mod 3) into its last group, the rest of that group is
# foreign (or padding): r=1 -> "XY==" keeps only X (drop 3), r=2 -> "XYZ=" keeps XY (drop 2).
_TAIL_DROP = {0: 0, 1: 3, 2: 2}
_URLSAFE = bytes.maketrans(b"+/", b"-_")


def _base64_cores(secret: bytes) -> list[bytes]:
    cores: list[bytes] = []
    for k in (0, 1, 2):
        encoded = base64.b64encode(b"\0" * k + secret)
        tail = _TAIL_DROP[(k + len(secret)) % 3]
        core = encoded[_LEAD_DROP[k] : len(encoded) - tail]
        cores.append(core)
        cores.append(core.translate(_URLSAFE))
    return cores


def _lower_hex(percent_encoded: str) -> str:
    parts = percent_encoded.split("%")
    return parts[0] + "".join("%" + p[:2].lower() + p[2:] for p in parts[1:])


def secret_forms(secret: bytes) -> tuple[bytes, ...]:
    """Every form of ``secret`` to scrub, longest first, deduplicated, each >= 4 bytes.

    - the raw secret;
    - ``quote(secret, safe="")`` and ``quote_plus(secret)``, each also with lower-case hex
      digits (``%2f``), which some encoders emit;
    - the JSON string body ``json.dumps(secret.decode("utf-8", "replace"))[1:-1]`` (with
      ``\\uXXXX`` escapes) and its ``ensure_ascii=False`` variant, UTF-8 encoded;
    - base64 stable cores. Where the secret sits inside a larger base64 blob (HTTP Basic
      ``base64(user ":" secret)``, a JWT claim, a JSON blob), the encoding of its bytes
      depends on its offset modulo 3 and on the neighbouring bytes. For each alignment
      ``k`` in 0, 1, 2, encode ``b"\\0" * k + secret``; base64 maps 3-byte groups to 4
      characters, so when the first group holds ``k`` foreign bytes the first 0, 2 or 3
      characters (k = 0, 1, 2) carry foreign bits and are dropped. At the end, when
      ``(k + len(secret)) % 3`` is 1 the last group encodes as ``XY==`` and only ``X`` is
      the secret's own (drop 3); when it is 2, ``XYZ=`` keeps ``XY`` (drop 2); when it is 0
      nothing is dropped. What remains appears verbatim whenever the secret is embedded at
      that alignment, whatever surrounds it, with or without padding. Each core is listed
      in the standard and the URL-safe (``-_``) alphabets. Base64 broken into lines (MIME)
      is not covered.
    """
    text = secret.decode("utf-8", "replace")
    quoted = quote(secret, safe="")
    quoted_plus = quote_plus(secret, safe="")
    candidates = [
        secret,
        quoted.encode("ascii"),
        _lower_hex(quoted).encode("ascii"),
        quoted_plus.encode("ascii"),
        _lower_hex(quoted_plus).encode("ascii"),
        json.dumps(text)[1:-1].encode("ascii"),
        json.dumps(text, ensure_ascii=False)[1:-1].encode("utf-8"),
        *_base64_cores(secret),
    ]
    unique = {form for form in candidates if len(form) >= MIN_FORM_BYTES}
    return tuple(sorted(unique, key=lambda form: (-len(form), form)))


class StreamRedactor:
    """Redact forms from a byte stream fed in arbitrary chunks.

    ``feed`` returns what is final now; ``finish`` returns the held-back tail. The
    concatenation has exactly the input's length. ``redactions`` counts occurrences
    replaced so far; an occurrence lying entirely inside another one (say one form nested
    in a longer form) is not counted twice. An occurrence in the held-back tail is counted
    once it can no longer turn out to be nested, at the latest by ``finish``.
    """

    def __init__(self, forms: Sequence[bytes]) -> None:
        if any(not form for form in forms):
            raise ValueError("redaction forms must be non-empty")
        self._forms: tuple[bytes, ...] = tuple(
            sorted(set(forms), key=lambda form: (-len(form), form))
        )
        self._hold_max = max((len(form) for form in self._forms), default=1) - 1
        self._first_bytes = frozenset(form[0] for form in self._forms)
        # The held-back tail, both as received (searched again with the next chunk) and
        # as redacted so far (stars of every occurrence found reaching into it).
        self._tail = b""
        self._tail_redacted = b""
        # End of the last counted occurrence, relative to the start of the held-back tail.
        self._reach = 0
        self.redactions = 0

    def feed(self, data: bytes) -> bytes:
        if not self._forms:
            return data
        if not data:
            return b""
        has_tail = bool(self._tail)
        original = self._tail + data if has_tail else data
        cut = len(original) - self._pending_prefix(original)
        spans = self._scan(original, cut)
        if spans:
            out = bytearray(self._tail_redacted)
            out += data
            for start, end in spans:
                out[start:end] = b"*" * (end - start)
            redacted = bytes(out)
        else:
            redacted = self._tail_redacted + data if has_tail else data
        self._tail = original[cut:]
        self._tail_redacted = redacted[cut:]
        return redacted[:cut] if cut < len(redacted) else redacted

    def finish(self) -> bytes:
        self._scan(self._tail, len(self._tail))  # count what is left; it is starred already
        out = self._tail_redacted
        self._tail = b""
        self._tail_redacted = b""
        self._reach = 0
        return out

    def _scan(self, data: bytes, cut: int) -> list[tuple[int, int]]:
        """Find every occurrence in ``data``; return merged spans to star.

        Occurrences starting before ``cut`` are final and counted unless nested in one
        counted before. Those starting at or after ``cut`` lie in the held-back tail: a
        longer occurrence may still grow around them, so they are found (and counted)
        again with the next chunk. Stars of occurrences that start before ``cut`` but reach
        into the tail are carried in ``_tail_redacted``.
        """
        hits: list[tuple[int, int]] = []
        for form in self._forms:
            at = data.find(form)
            while at != -1:
                hits.append((at, at + len(form)))
                at = data.find(form, at + 1)
        reach = self._reach
        merged: list[tuple[int, int]] = []
        if hits:
            hits.sort(key=lambda span: (span[0], -span[1]))
            for start, end in hits:
                if start < cut and end > reach:
                    self.redactions += 1
                    reach = end
                if merged and start <= merged[-1][1]:
                    if end > merged[-1][1]:
                        merged[-1] = (merged[-1][0], end)
                else:
                    merged.append((start, end))
        self._reach = reach - cut  # in the coordinates of the next call's data
        return merged

    def _pending_prefix(self, data: bytes) -> int:
        """Length of the longest suffix of ``data`` that is a proper prefix of some form."""
        window_start = max(0, len(data) - self._hold_max)
        for at in range(window_start, len(data)):
            if data[at] in self._first_bytes:
                rest = data[at:]
                if any(len(form) > len(rest) and form.startswith(rest) for form in self._forms):
                    return len(data) - at
        return 0


def redact(data: bytes, forms: Sequence[bytes]) -> tuple[bytes, int]:
    """Redact ``data`` in one go (header values); returns the result and the match count."""
    redactor = StreamRedactor(forms)
    out = redactor.feed(data) + redactor.finish()
    return out, redactor.redactions
