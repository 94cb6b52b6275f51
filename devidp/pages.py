"""The two HTML pages of the development identity provider: login and error."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from html import escape

from devidp.users import User

_STYLE = """
body { font-family: system-ui, sans-serif; max-width: 28rem; margin: 3rem auto; padding: 0 1rem; }
label { display: block; margin-top: .8rem; }
input[type=text], input[type=password] { width: 100%; padding: .4rem; box-sizing: border-box; }
button { margin-top: 1rem; padding: .4rem 1.2rem; }
.error { color: #a00; font-weight: bold; }
table { border-collapse: collapse; margin-top: .5rem; }
td, th { border: 1px solid #ccc; padding: .2rem .6rem; text-align: left; }
.note { color: #666; font-size: .9rem; }
"""


def _page(title: str, body: str) -> str:
    return (
        "<!doctype html>\n<html lang='en'><head><meta charset='utf-8'>"
        f"<title>{escape(title)}</title><style>{_STYLE}</style></head>"
        f"<body>\n{body}\n</body></html>\n"
    )


def login_page(params: Mapping[str, str], users: Iterable[User], error: str | None) -> str:
    hidden = "\n".join(
        f"<input type='hidden' name='{escape(k, quote=True)}' value='{escape(v, quote=True)}'>"
        for k, v in params.items()
    )
    rows = "\n".join(
        f"<tr><td>{escape(u.username)}</td><td>{escape(u.password)}</td>"
        f"<td>{escape(', '.join(u.roles) or '-')}</td></tr>"
        for u in users
    )
    message = f"<p class='error' role='alert'>{escape(error)}</p>" if error else ""
    body = f"""<h1>devidp sign-in</h1>
<p class='note'>Development identity provider. Do not use real credentials here.</p>
{message}
<form method='post' action='/authorize'>
{hidden}
<label>Username <input type='text' name='username' autocomplete='username' autofocus></label>
<label>Password
<input type='password' name='password' autocomplete='current-password'></label>
<button type='submit'>Sign in</button>
</form>
<h2>Demo users</h2>
<table><tr><th>username</th><th>password</th><th>roles</th></tr>
{rows}
</table>"""
    return _page("devidp sign-in", body)


def error_page(message: str) -> str:
    body = f"<h1>Bad authorization request</h1>\n<p class='error'>{escape(message)}</p>"
    return _page("devidp error", body)
