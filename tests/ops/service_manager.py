"""A small stand-in for systemd's service manager, for the operations walkthrough.

This machine's PID 1 is not systemd, so ``systemctl`` cannot start units. The walkthrough runs
the document's blocks as written and puts two shims first on ``PATH``, ``systemctl`` and
``journalctl``, which hand their argv to a :class:`ServiceManager` over a unix socket. The
manager reads the unit files the document installed and starts a service the way systemd
would start it:

- the environment: ``PATH`` as systemd sets it, ``Environment=``, ``EnvironmentFile=`` (``-``
  for optional), ``INVOCATION_ID``, ``JOURNAL_STREAM`` (the output pipe's ``dev:inode``);
- ``StateDirectory=``/``RuntimeDirectory=``/``CacheDirectory=``/``LogsDirectory=``/
  ``ConfigurationDirectory=`` created with their ``*Mode=`` and exported
  (``STATE_DIRECTORY``, ...); the runtime directory and the credentials are removed at stop
  (unless ``RuntimeDirectoryPreserve=yes``);
- ``LoadCredential=``/``LoadCredentialEncrypted=`` (the latter through ``systemd-creds
  decrypt``) copied to ``/run/credentials/UNIT`` with mode 0400, ``CREDENTIALS_DIRECTORY``;
  an empty assignment resets the list, as in systemd;
- ``NOTIFY_SOCKET`` for ``Type=notify``: start returns on ``READY=1``, fails when the
  process exits first; ``Type=forking`` waits for ``ExecStart=`` and reads ``PIDFile=``;
- ``ExecStart=`` under ``setpriv`` with ``CapabilityBoundingSet=`` and ``NoNewPrivileges=``,
  ``prlimit`` with ``LimitCORE=``/``LimitNOFILE=``/``LimitNPROC=``, ``UMask=``,
  ``WorkingDirectory=``; stdout and stderr go to the unit's journal;
- ``LimitNOFILE=`` above the hard limit this process may set is lowered to it (systemd, as
  PID 1, may raise it; this machine lacks ``CAP_SYS_RESOURCE``), with a line in the journal;
- stop: ``ExecStop=`` if any, else ``KillSignal=`` (SIGTERM) to the main process, SIGKILL
  after ``TimeoutStopSec=``.

Not emulated (reported as such in docs/operations.md): the sandboxing directives
(``ProtectSystem=``, ``ReadWritePaths=``, ...), ``User=``, restart policies, dependencies and
ordering, cgroup placement. ``systemd-analyze verify`` (the real one) checks the files.

Resource handling: :meth:`ServiceManager.serve` runs in a thread of its own; every started
process is tracked and :meth:`ServiceManager.close` stops whatever still runs.
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import secrets
import shlex
import shutil
import signal
import socket
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

UNIT_DIRS = (
    Path("/etc/systemd/system"),
    Path("/lib/systemd/system"),
    Path("/usr/lib/systemd/system"),
)
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
START_TIMEOUT = 60.0
STOP_TIMEOUT = 30.0
DIRECTORY_KINDS = {
    "StateDirectory": (Path("/var/lib"), "STATE_DIRECTORY"),
    "RuntimeDirectory": (Path("/run"), "RUNTIME_DIRECTORY"),
    "CacheDirectory": (Path("/var/cache"), "CACHE_DIRECTORY"),
    "LogsDirectory": (Path("/var/log"), "LOGS_DIRECTORY"),
    "ConfigurationDirectory": (Path("/etc"), "CONFIGURATION_DIRECTORY"),
}
LIMITS = {
    "LimitCORE": ("--core", resource.RLIMIT_CORE),
    "LimitNOFILE": ("--nofile", resource.RLIMIT_NOFILE),
    "LimitNPROC": ("--nproc", resource.RLIMIT_NPROC),
}


class UnitError(Exception):
    """A unit cannot be loaded or run; the message is what systemctl would print."""


def parse_unit_text(
    text: str, into: dict[str, dict[str, list[str]]] | None = None
) -> dict[str, dict[str, list[str]]]:
    """Sections -> key -> values. An empty assignment resets the key's list (as systemd
    does for list settings); continuation lines ending in ``\\`` are joined."""
    sections = into if into is not None else {}
    section: dict[str, list[str]] | None = None
    pending = ""
    for raw in text.splitlines():
        line = pending + raw.strip()
        pending = ""
        if line.endswith("\\"):
            pending = line[:-1] + " "
            continue
        if not line or line[0] in "#;":
            continue
        if line.startswith("[") and line.endswith("]"):
            section = sections.setdefault(line[1:-1], {})
            continue
        if section is None or "=" not in line:
            raise UnitError(f"unparsable unit line: {raw!r}")
        key, value = (part.strip() for part in line.split("=", 1))
        if value == "":
            section[key] = []
        else:
            section.setdefault(key, []).append(value)
    return sections


def load_unit(name: str) -> dict[str, dict[str, list[str]]]:
    """The unit file of ``name`` from the first unit directory holding it, plus drop-ins."""
    for directory in UNIT_DIRS:
        path = directory / name
        if path.is_file():
            sections = parse_unit_text(path.read_text())
            break
    else:
        raise UnitError(f"Unit {name} not found.")
    for directory in UNIT_DIRS:
        dropins = directory / f"{name}.d"
        if dropins.is_dir():
            for conf in sorted(dropins.glob("*.conf")):
                parse_unit_text(conf.read_text(), sections)
    return sections


def parse_env_file(text: str) -> dict[str, str]:
    """systemd's EnvironmentFile= format: KEY=VALUE, ``#``/``;`` comments, optional quotes."""
    values: dict[str, str] = {}
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line[0] in "#;":
            continue
        key, sep, value = line.partition("=")
        if not sep:
            continue
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
            value = value[1:-1]
        values[key.strip()] = value
    return values


def split_command(line: str) -> tuple[str, list[str]]:
    """(prefix flags, argv) of an Exec*= line."""
    flags = ""
    while line and line[0] in "-@:+!":
        flags += line[0]
        line = line[1:]
    return flags, shlex.split(line)


def normalise(name: str) -> str:
    return name if "." in name else f"{name}.service"


@dataclass
class Service:
    name: str
    proc: subprocess.Popen[bytes] | None = None
    main_pid: int | None = None
    state: str = "inactive"  # inactive, active, failed
    status_text: str = ""
    since: float = 0.0
    exit_code: int | None = None
    runtime_dirs: list[Path] = field(default_factory=list)
    credentials: Path | None = None
    pump: threading.Thread | None = None


class ServiceManager:
    """Starts and stops units; answers the shims. ``journal_dir`` keeps one log per unit."""

    def __init__(self, journal_dir: Path, control_socket: Path) -> None:
        self.journal_dir = journal_dir
        self.control_socket = control_socket
        self.services: dict[str, Service] = {}
        self._lock = threading.Lock()
        self._listener: socket.socket | None = None

    # -- the shims' side -----------------------------------------------------------------

    def serve(self) -> None:
        """Answer shim requests until :meth:`close` (run in a thread)."""
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(str(self.control_socket))
        listener.listen(8)
        self._listener = listener
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            with conn:
                data = b""
                while not data.endswith(b"\n"):
                    chunk = conn.recv(65536)
                    if not chunk:
                        break
                    data += chunk
                request = json.loads(data)
                code, out, err = self.handle(request["tool"], request["argv"])
                conn.sendall(json.dumps({"code": code, "stdout": out, "stderr": err}).encode())

    def handle(self, tool: str, argv: Sequence[str]) -> tuple[int, str, str]:
        with self._lock:
            try:
                if tool == "systemctl":
                    return self.systemctl(list(argv))
                if tool == "journalctl":
                    return 0, self.journalctl(list(argv)), ""
                return 1, "", f"{tool}: not emulated\n"
            except UnitError as exc:
                return 1, "", f"{exc}\n"

    def systemctl(self, argv: list[str]) -> tuple[int, str, str]:
        now = "--now" in argv
        args = [a for a in argv if not a.startswith("-")]
        unknown = [
            a
            for a in argv
            if a.startswith("-") and a not in ("--now", "--no-pager", "-q", "--quiet")
        ]
        if unknown or not args:
            raise UnitError(f"systemctl {' '.join(argv)}: not emulated")
        verb, units = args[0], [normalise(u) for u in args[1:]]
        out: list[str] = []
        if verb == "daemon-reload":
            for path in self._installed_units():
                load_unit(path.name)
            return 0, "", ""
        if verb in ("enable", "disable"):
            for unit in units:
                self._set_enabled(unit, verb == "enable")
                if now:
                    (self.start if verb == "enable" else self.stop)(unit)
            return 0, "", ""
        if verb in ("start", "stop", "restart", "reload"):
            for unit in units:
                if verb in ("stop", "restart"):
                    self.stop(unit)
                if verb in ("start", "restart"):
                    self.start(unit)
                if verb == "reload":
                    self.reload(unit)
            return 0, "", ""
        if verb == "is-active":
            states = [self.services.get(u, Service(u)).state for u in units]
            quiet = "-q" in argv or "--quiet" in argv
            text = "" if quiet else "".join(f"{s}\n" for s in states)
            return (0 if all(s == "active" for s in states) else 3), text, ""
        if verb == "status":
            code = 0
            for unit in units:
                service = self.services.get(unit, Service(unit))
                out.append(self._status(unit, service))
                code = code or (0 if service.state == "active" else 3)
            return code, "\n".join(out), ""
        raise UnitError(f"systemctl {verb}: not emulated")

    def journalctl(self, argv: list[str]) -> str:
        unit: str | None = None
        lines: int | None = None
        output = "short"
        items = iter(argv)
        for arg in items:
            if arg in ("-u", "--unit"):
                unit = normalise(next(items))
            elif arg.startswith("--unit="):
                unit = normalise(arg.split("=", 1)[1])
            elif arg in ("-n", "--lines"):
                lines = int(next(items))
            elif arg in ("-o", "--output"):
                output = next(items)
            elif arg in ("--no-pager", "-q"):
                continue
            else:
                raise UnitError(f"journalctl {arg}: not emulated")
        if unit is None:
            raise UnitError("journalctl without -u: not emulated")
        path = self.journal_dir / f"{unit}.log"
        entries = path.read_text(errors="replace").splitlines() if path.exists() else []
        if lines is not None:
            entries = entries[-lines:] if lines else []
        if output != "cat":
            entries = [f"{time.strftime('%b %d %H:%M:%S')} localhost {unit}: {e}" for e in entries]
        return "".join(f"{e}\n" for e in entries)

    # -- units ---------------------------------------------------------------------------

    def _installed_units(self) -> list[Path]:
        return [p for p in UNIT_DIRS[0].glob("*.service") if p.is_file()]

    def _set_enabled(self, unit: str, enabled: bool) -> None:
        config = load_unit(unit) if enabled else None
        wanted_by = (config or {}).get("Install", {}).get("WantedBy", [])
        for directory in UNIT_DIRS[0].glob("*.wants"):
            link = directory / unit
            if link.is_symlink() and not enabled:
                link.unlink()
        for target in " ".join(wanted_by).split():
            wants = UNIT_DIRS[0] / f"{target}.wants"
            wants.mkdir(parents=True, exist_ok=True)
            link = wants / unit
            if not link.is_symlink():
                source = next(d / unit for d in UNIT_DIRS if (d / unit).is_file())
                link.symlink_to(source)

    def _status(self, unit: str, service: Service) -> str:
        try:
            description = " ".join(load_unit(unit).get("Unit", {}).get("Description", []))
        except UnitError:
            description = ""
        active = {
            "active": "active (running)",
            "inactive": "inactive (dead)",
            "failed": f"failed (Result: exit-code, status={service.exit_code})",
        }[service.state]
        lines = [f"● {unit} - {description}", f"     Active: {active}"]
        if service.state == "active":
            lines.append(f"   Main PID: {service.main_pid}")
        if service.status_text:
            lines.append(f'     Status: "{service.status_text}"')
        lines.append(self.journalctl(["-u", unit, "-n", "10"]))
        return "\n".join(lines)

    def _journal(self, unit: str) -> Path:
        return self.journal_dir / f"{unit}.log"

    def _log(self, unit: str, message: str) -> None:
        with self._journal(unit).open("a") as fh:
            fh.write(message + "\n")

    def _environment(self, unit: str, service_cfg: dict[str, list[str]]) -> dict[str, str]:
        env = {"PATH": DEFAULT_PATH, "INVOCATION_ID": secrets.token_hex(16)}
        for assignment in service_cfg.get("Environment", []):
            for word in shlex.split(assignment):
                key, _, value = word.partition("=")
                env[key] = value
        for entry in service_cfg.get("EnvironmentFile", []):
            optional = entry.startswith("-")
            path = Path(entry.lstrip("-"))
            if not path.exists():
                if optional:
                    continue
                raise UnitError(f"Failed to load environment files: {path} does not exist")
            env.update(parse_env_file(path.read_text()))
        return env

    def _directories(
        self, service: Service, cfg: dict[str, list[str]], env: dict[str, str]
    ) -> None:
        for key, (base, variable) in DIRECTORY_KINDS.items():
            names = " ".join(cfg.get(key, [])).split()
            if not names:
                continue
            mode = int((cfg.get(f"{key}Mode") or ["0755"])[-1], 8)
            paths = []
            for name in names:
                path = base / name
                if not path.exists():
                    path.mkdir(parents=True, mode=mode)
                    path.chmod(mode)
                paths.append(path)
                if key == "RuntimeDirectory":
                    service.runtime_dirs.append(path)
            env[variable] = ":".join(str(p) for p in paths)
        if (cfg.get("RuntimeDirectoryPreserve") or ["no"])[-1] in ("yes", "true"):
            service.runtime_dirs.clear()

    def _credentials(
        self, service: Service, cfg: dict[str, list[str]], env: dict[str, str]
    ) -> None:
        plain = cfg.get("LoadCredential", [])
        encrypted = cfg.get("LoadCredentialEncrypted", [])
        if not plain and not encrypted:
            return
        directory = Path("/run/credentials") / service.name
        directory.mkdir(parents=True, exist_ok=True)
        seen: set[str] = set()
        for entry, is_encrypted in [(e, False) for e in plain] + [(e, True) for e in encrypted]:
            ident, _, source = entry.partition(":")
            if ident in seen:
                raise UnitError(f"Duplicated credential value '{ident}'")
            seen.add(ident)
            target = directory / ident
            if not Path(source).is_file():
                raise UnitError(
                    f"{service.name}: Failed to set up credentials: {source} does not exist"
                )
            if is_encrypted:
                result = subprocess.run(
                    ["systemd-creds", "decrypt", f"--name={ident}", source, str(target)],
                    capture_output=True,
                    text=True,
                    check=False,
                )
                if result.returncode != 0:
                    raise UnitError(
                        f"Failed to decrypt credential {ident}: {result.stderr.strip()}"
                    )
            else:
                shutil.copyfile(source, target)
            target.chmod(0o400)
        directory.chmod(0o500)
        service.credentials = directory
        env["CREDENTIALS_DIRECTORY"] = str(directory)

    def _wrap(self, unit: str, cfg: dict[str, list[str]], argv: list[str]) -> list[str]:
        """``argv`` under prlimit and setpriv as the unit's limits and capabilities say."""
        wrapped = list(argv)
        caps = " ".join(cfg.get("CapabilityBoundingSet", [])).split()
        no_new_privs = (cfg.get("NoNewPrivileges") or ["no"])[-1] in ("yes", "true")
        if caps or no_new_privs:
            setpriv = ["setpriv"]
            if caps:
                names = [c.lstrip("~").lower().removeprefix("cap_") for c in caps]
                if caps[0].startswith("~"):
                    setpriv.append("--bounding-set=" + ",".join(f"-{n}" for n in names))
                else:
                    setpriv.append("--bounding-set=-all," + ",".join(f"+{n}" for n in names))
                setpriv += ["--inh-caps=-all", "--ambient-caps=-all"]
            if no_new_privs:
                setpriv.append("--no-new-privs")
            wrapped = [*setpriv, "--", *wrapped]
        limits = []
        for key, (option, kind) in LIMITS.items():
            values = cfg.get(key)
            if not values:
                continue
            soft, _, hard = values[-1].partition(":")
            wanted = [_limit(soft), _limit(hard or soft)]
            ceiling = resource.getrlimit(kind)[1]
            if ceiling != resource.RLIM_INFINITY and any(
                v == resource.RLIM_INFINITY or v > ceiling for v in wanted
            ):
                # systemd (PID 1) may raise a hard limit; without CAP_SYS_RESOURCE (this
                # machine's bounding set lacks it) nobody here can: keep the ceiling.
                self._log(unit, f"{key}={values[-1]} lowered to {ceiling} (no CAP_SYS_RESOURCE)")
                wanted = [
                    min(ceiling, v) if v != resource.RLIM_INFINITY else ceiling for v in wanted
                ]
            text = ["unlimited" if v == resource.RLIM_INFINITY else str(v) for v in wanted]
            limits.append(f"{option}={text[0]}:{text[1]}")
        if limits:
            wrapped = ["prlimit", *limits, "--", *wrapped]
        return wrapped

    def _run_aux(self, unit: str, cfg: dict[str, list[str]], key: str, env: dict[str, str]) -> None:
        for line in cfg.get(key, []):
            flags, argv = split_command(line)
            result = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
            for text in (result.stdout, result.stderr):
                for entry in text.splitlines():
                    self._log(unit, entry)
            if result.returncode != 0 and "-" not in flags:
                raise UnitError(f"{unit}: {key} {argv[0]} failed with status {result.returncode}")

    def start(self, unit: str) -> None:
        service = self.services.setdefault(unit, Service(unit))
        if service.state == "active":
            return
        config = load_unit(unit)
        cfg = config.get("Service", {})
        kind = (cfg.get("Type") or ["simple"])[-1]
        env = self._environment(unit, cfg)
        service.runtime_dirs = []
        service.status_text = ""
        try:
            self._directories(service, cfg, env)
            self._credentials(service, cfg, env)
            self._run_aux(unit, cfg, "ExecStartPre", env)
            self._launch(unit, service, cfg, kind, env)
            self._run_aux(unit, cfg, "ExecStartPost", env)
        except UnitError as exc:
            self._log(unit, str(exc))
            self._cleanup(service)
            service.state = "failed"
            raise UnitError(
                f"Job for {unit} failed because the control process exited with error code.\n"
                f'See "systemctl status {unit}" and "journalctl -xeu {unit}" for details.'
            ) from exc
        service.state = "active"
        service.since = time.time()

    def _launch(
        self, unit: str, service: Service, cfg: dict[str, list[str]], kind: str, env: dict[str, str]
    ) -> None:
        lines = cfg.get("ExecStart", [])
        if len(lines) != 1:
            raise UnitError(f"{unit}: expected one ExecStart=, got {len(lines)}")
        _, argv = split_command(lines[0])
        argv = self._wrap(unit, cfg, argv)
        umask = int((cfg.get("UMask") or ["0022"])[-1], 8)
        directories = cfg.get("WorkingDirectory")
        cwd = directories[-1] if directories else None
        notify: socket.socket | None = None
        if kind == "notify":
            path = Path("/run/systemd/notify-walkthrough") / f"{unit}.sock"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.unlink(missing_ok=True)
            notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            notify.bind(str(path))
            env["NOTIFY_SOCKET"] = str(path)
        read_end, write_end = os.pipe()
        info = os.fstat(write_end)
        env["JOURNAL_STREAM"] = f"{info.st_dev}:{info.st_ino}"
        try:
            proc = subprocess.Popen(
                argv,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=write_end,
                stderr=write_end,
                cwd=cwd,
                umask=umask,
                start_new_session=True,
            )
        finally:
            os.close(write_end)
        service.proc = proc
        service.main_pid = proc.pid
        service.pump = threading.Thread(target=self._pump, args=(unit, read_end), daemon=True)
        service.pump.start()
        if kind == "notify" and notify is not None:
            try:
                self._wait_ready(unit, service, proc, notify)
            finally:
                notify.close()
        elif kind == "forking":
            code = proc.wait(timeout=START_TIMEOUT)
            if code != 0:
                raise UnitError(f"{unit}: ExecStart exited with status {code}")
            pid_file = (cfg.get("PIDFile") or [""])[-1]
            if not pid_file:
                raise UnitError(f"{unit}: Type=forking without PIDFile= is not emulated")
            service.proc = None
            service.main_pid = int(Path(pid_file).read_text().strip())

    def _wait_ready(
        self, unit: str, service: Service, proc: subprocess.Popen[bytes], notify: socket.socket
    ) -> None:
        deadline = time.monotonic() + START_TIMEOUT
        notify.settimeout(0.2)
        while time.monotonic() < deadline:
            try:
                message = notify.recv(4096).decode(errors="replace")
            except TimeoutError:
                message = ""
            fields = dict(line.split("=", 1) for line in message.splitlines() if "=" in line)
            if "STATUS" in fields:
                service.status_text = fields["STATUS"]
            if fields.get("READY") == "1":
                return
            code = proc.poll()
            if code is not None:
                service.exit_code = code
                self._drain(service)
                raise UnitError(f"{unit}: Main process exited, code=exited, status={code}/FAILURE")
        proc.kill()
        proc.wait()
        raise UnitError(f"{unit}: start operation timed out")

    def _pump(self, unit: str, fd: int) -> None:
        with os.fdopen(fd, "rb") as stream, self._journal(unit).open("ab") as journal:
            for line in stream:
                journal.write(line)
                journal.flush()

    def _drain(self, service: Service) -> None:
        if service.pump is not None:
            service.pump.join(timeout=10)

    def stop(self, unit: str) -> None:
        service = self.services.get(unit)
        if service is None or service.state != "active":
            if service is not None and service.state == "failed":
                service.state = "inactive"
            return
        cfg = load_unit(unit).get("Service", {})
        timeout = float((cfg.get("TimeoutStopSec") or [str(STOP_TIMEOUT)])[-1].rstrip("s"))
        env = {"PATH": DEFAULT_PATH, "MAINPID": str(service.main_pid)}
        if cfg.get("ExecStop"):
            with contextlib.suppress(UnitError):
                self._run_aux(unit, cfg, "ExecStop", env)
        else:
            sig = signal.Signals[(cfg.get("KillSignal") or ["SIGTERM"])[-1]]
            self._signal(service, sig)
        if not self._wait_exit(service, timeout):
            self._log(unit, f"{unit}: State 'stop-sigterm' timed out. Killing.")
            self._signal(service, signal.SIGKILL)
            self._wait_exit(service, STOP_TIMEOUT)
        self._drain(service)
        self._cleanup(service)
        code = service.exit_code
        service.state = "inactive" if code in (0, None, -signal.SIGTERM) else "failed"
        service.proc = None
        service.main_pid = None

    def reload(self, unit: str) -> None:
        service = self.services.get(unit)
        if service is None or service.state != "active":
            raise UnitError(f"{unit} is not active, cannot reload.")
        cfg = load_unit(unit).get("Service", {})
        if not cfg.get("ExecReload"):
            raise UnitError(
                f"Failed to reload {unit}: Job type reload is not applicable for unit {unit}."
            )
        self._run_aux(
            unit, cfg, "ExecReload", {"PATH": DEFAULT_PATH, "MAINPID": str(service.main_pid)}
        )

    def _signal(self, service: Service, sig: signal.Signals) -> None:
        if service.main_pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(service.main_pid, sig)

    def _wait_exit(self, service: Service, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if service.proc is not None:
                try:
                    service.exit_code = service.proc.wait(timeout=0.2)
                    return True
                except subprocess.TimeoutExpired:
                    continue
            if service.main_pid is None or not _alive(service.main_pid):
                return True
            time.sleep(0.1)
        return False

    def _cleanup(self, service: Service) -> None:
        for path in service.runtime_dirs:
            shutil.rmtree(path, ignore_errors=True)
        service.runtime_dirs = []
        if service.credentials is not None:
            shutil.rmtree(service.credentials, ignore_errors=True)
            service.credentials = None

    def close(self) -> None:
        """Stop every running unit and the shim listener."""
        with self._lock:
            for unit, service in list(self.services.items()):
                if service.state == "active":
                    self.stop(unit)
        if self._listener is not None:
            self._listener.close()


def _limit(text: str) -> int:
    return resource.RLIM_INFINITY if text == "infinity" else int(text)


def _alive(pid: int) -> bool:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return text.rsplit(")", 1)[1].split()[0] != "Z"


SHIM = """#!{python}
# {tool} stand-in for the operations walkthrough (tests/ops/service_manager.py)
import json, socket, sys
sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
sock.connect({socket!r})
sock.sendall(json.dumps({{"tool": {tool!r}, "argv": sys.argv[1:]}}).encode() + b"\\n")
data = b""
while True:
    chunk = sock.recv(65536)
    if not chunk:
        break
    data += chunk
answer = json.loads(data)
sys.stdout.write(answer["stdout"])
sys.stderr.write(answer["stderr"])
sys.exit(answer["code"])
"""


def write_shims(directory: Path, control_socket: Path) -> None:
    """``systemctl`` and ``journalctl`` executables in ``directory`` that ask the manager."""
    directory.mkdir(parents=True, exist_ok=True)
    for tool in ("systemctl", "journalctl"):
        path = directory / tool
        path.write_text(SHIM.format(python=sys.executable, tool=tool, socket=str(control_socket)))
        path.chmod(stat.S_IRWXU | stat.S_IRGRP | stat.S_IXGRP | stat.S_IROTH | stat.S_IXOTH)
