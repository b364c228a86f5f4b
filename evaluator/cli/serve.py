"""Serve the Streamlit dashboard (`dashboard/app.py`) on a metrics database, in the foreground.

The app runs in a child process (`python -m streamlit run`), local only by default, with Streamlit's
usage statistics off (nothing leaves the machine) and the database passed through as `--db`.
"""

from __future__ import annotations

import errno
import signal
import socket
import subprocess
import sys
import threading
from importlib.resources import files
from pathlib import Path

from evaluator.errors import StoreError, UsageError
from evaluator.store.lake import locate

APP = Path(str(files("dashboard") / "app.py"))


def streamlit_command(
    db: Path, host: str, port: int, thresholds: Path | None = None, alerts: Path | None = None
) -> list[str]:
    """The command line that serves the dashboard on `host:port`."""
    command = [
        sys.executable, "-m", "streamlit", "run", str(APP),
        "--server.address", host,
        "--server.port", str(port),
        "--server.headless", "true",
        "--server.fileWatcherType", "none",
        "--server.runOnSave", "false",
        "--browser.gatherUsageStats", "false",
        "--global.developmentMode", "false",
        "--client.toolbarMode", "viewer",
        "--", "--db", locate(db).given if locate(db).folder is None else str(locate(db).folder),
    ]  # fmt: skip
    if thresholds is not None:
        command += ["--thresholds", str(Path(thresholds).resolve())]
    if alerts is not None:
        command += ["--alerts", str(Path(alerts).resolve())]
    return command


def check_inputs(db: Path, port: int, thresholds: Path | None, host: str = "127.0.0.1") -> None:
    """StoreError for a missing database, UsageError for a missing thresholds file or an address the
    dashboard cannot listen on (`require_free_port`)."""
    if not locate(db).exists():
        raise StoreError(f"{db}: no such metrics store (make one with `proxaudit replay LOGS --db {db}`)")
    if thresholds is not None and not Path(thresholds).is_file():
        raise UsageError(f"--thresholds {thresholds}: no such file")
    require_free_port(host, port)


def _bind_error(host: str, port: int) -> OSError | None:
    """Why the dashboard could not listen on `host:port` now, or None: each address of the host bound as
    Streamlit's server (tornado's `bind_sockets`) binds them, with SO_REUSEADDR (a port in TIME_WAIT is
    free) and skipping an IPv6 address this machine lacks."""
    try:
        addresses = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as error:
        return error
    for family, kind, proto, _, address in addresses:
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind(address)
            except OSError as error:
                if not (family == socket.AF_INET6 and error.errno == errno.EADDRNOTAVAIL):
                    return error
    return None


def require_free_port(host: str, port: int) -> None:
    """UsageError when the dashboard could not listen on `host:port` (not a TCP port, a port another
    program holds, an address not of this machine), suggesting the next free `--port`."""
    if not 0 < port < 65536:
        raise UsageError(f"--port {port}: not a TCP port (1-65535)")
    error = _bind_error(host, port)
    if error is None:
        return
    if getattr(error, "errno", None) != errno.EADDRINUSE:
        raise UsageError(f"cannot serve the dashboard on {host}:{port}: {error}; check --host and --port")
    free = next((p for p in range(port + 1, min(port + 100, 65536)) if _bind_error(host, p) is None), None)
    hint = f"give another one, e.g. --port {free}" if free else "give another one with --port"
    raise UsageError(f"port {port} on {host} is in use (another dashboard, or another program): {hint}")


def _interrupt(signum, frame) -> None:
    raise KeyboardInterrupt


def serve(
    db: Path,
    host: str = "127.0.0.1",
    port: int = 8501,
    thresholds: Path | None = None,
    alerts: Path | None = None,
) -> int:
    """Serve the dashboard on `db` until Ctrl-C or SIGTERM (or the server exits); returns the exit code."""
    check_inputs(db, port, thresholds, host)
    main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _interrupt) if main_thread else None
    if alerts is not None and Path(alerts).is_dir():
        raise UsageError(f"--alerts {alerts}: is a folder, not the file `proxaudit watch --alerts` writes")
    child = subprocess.Popen(streamlit_command(db, host, port, thresholds, alerts))
    print(f"proxaudit dashboard: http://{host}:{port}  (database {db}; Ctrl-C stops it)", flush=True)
    try:
        return child.wait()
    except KeyboardInterrupt:
        return 0
    finally:
        if child.poll() is None:
            child.terminate()  # Ctrl-C reached the child already; SIGTERM covers a signal to us alone
            try:
                child.wait(timeout=10)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()
        if main_thread:
            signal.signal(signal.SIGTERM, previous)
