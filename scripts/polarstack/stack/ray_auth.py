"""Ray's token authentication (RAY_AUTH_MODE=token, in ray since 2.52; RAY_VERSION pins a release that has it): the stack's token.

The project makes the token itself: 32 random bytes as 64 hex digits, the shape of ray's own
`generate_new_authentication_token` (ray/_private/authentication/authentication_token_generator.py), written
to a file of mode 0600 outside the repository and the images (RAY_AUTH_TOKEN_FILE in configs/cluster.env, else
$XDG_CONFIG_HOME/polarstack/ray-auth-token). `ray get-auth-token --generate` is not used: it prints the token
and writes ~/.ray/auth_token with mode 0644. Every Ray process of the stack reads the file through
RAY_AUTH_TOKEN_PATH (head, workers, `ray job submit`, the launch script's Ray calls, slime's driver). The
token's text never leaves this module except into that file and, for HTTP calls this package makes itself,
the Authorization header (ray/_private/authentication/http_token_authentication.py reads "Bearer <token>").
"""

from __future__ import annotations

import os
import secrets
import stat
from pathlib import Path

from polarstack.errors import ExitCode, StackError
from polarstack.paths import repo_root

MODE_ENV = {"RAY_AUTH_MODE": "token"}
# Where the trainer container (every node) sees the host's token file: a read-only bind mount (compose.yaml).
CONTAINER_TOKEN_PATH = "/run/polarstack-secrets/ray-auth-token"
TOKEN_HEX_DIGITS = 64
# The variable of .run/compose/<profile>.env that names the host's token file, the mount's source (never its text).
MOUNT_SOURCE_KEY = "RAY_AUTH_TOKEN_FILE"


def default_path() -> Path:
    xdg = os.environ.get("XDG_CONFIG_HOME")
    return (Path(xdg) if xdg else Path.home() / ".config") / "polarstack" / "ray-auth-token"


def token_path(configured: str = "") -> Path:
    """The host's token file: `configured` (RAY_AUTH_TOKEN_FILE as the caller's cluster resolved it: Cluster.token_file,
    configs/cluster.env or the environment), else the default under the config home."""
    text = configured.strip()
    path = Path(text).expanduser() if text else default_path()
    if not path.is_absolute():
        raise StackError(f"RAY_AUTH_TOKEN_FILE={text} must be an absolute path (configs/cluster.env).", ExitCode.USAGE)
    return path


def _inside_repository(path: Path) -> bool:
    try:
        path.resolve().relative_to(repo_root().resolve())
    except ValueError:
        return False
    return True


def _refuse_inside_repository(path: Path) -> None:
    if _inside_repository(path):
        raise StackError(
            f"the Ray token file {path} is inside the repository, where a commit or an image build could take it; "
            "set RAY_AUTH_TOKEN_FILE to a path outside it.",
            ExitCode.USAGE,
        )


def check(path: Path) -> Path:
    """`path` when it is a token file the stack accepts: a regular file of this user, mode 0600 (no group or other
    bit), outside the repository, holding 64 hex digits. Else a USAGE/STATE StackError naming the fix."""
    _refuse_inside_repository(path)
    try:
        info = path.lstat()
    except FileNotFoundError:
        raise StackError(
            f"no Ray token at {path}: `make up` on the head (NODE_RANK=0) writes it; copy that file to the same "
            "path on this node (mode 0600), or set RAY_AUTH_TOKEN_FILE.",
            ExitCode.STATE,
        ) from None
    if not stat.S_ISREG(info.st_mode):
        raise StackError(
            f"the Ray token {path} is not a regular file; remove it and run `make up` again.", ExitCode.STATE
        )
    if info.st_mode & 0o077:
        raise StackError(
            f"the Ray token {path} has mode {stat.S_IMODE(info.st_mode):04o}: others could read it; run chmod 600 {path}.",
            ExitCode.STATE,
        )
    if info.st_uid != os.getuid():
        raise StackError(
            f"the Ray token {path} belongs to uid {info.st_uid}, not to you; remove or chown it.", ExitCode.STATE
        )
    text = path.read_text(errors="replace").strip()
    if len(text) != TOKEN_HEX_DIGITS or any(c not in "0123456789abcdef" for c in text):
        raise StackError(
            f"the Ray token {path} is not {TOKEN_HEX_DIGITS} hex digits; remove it and run `make up` on the head again "
            "(then copy it to every node).",
            ExitCode.STATE,
        )
    return path


def ensure(path: Path | None = None) -> Path:
    """The token file, written (mode 0600, created exclusively) when missing; checked either way. Nothing printed."""
    path = path or token_path()
    _refuse_inside_repository(path)  # before anything is written there
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            pass  # another `make up` wrote it just now: check that one
        else:
            with os.fdopen(fd, "w") as handle:
                handle.write(secrets.token_hex(TOKEN_HEX_DIGITS // 2) + "\n")
    return check(path)


def prepare(path: Path, *, head: bool) -> Path:
    """Before `make up`: the head (NODE_RANK=0, and every single node) writes the token when it is missing; any other
    node only checks the copy it was given (check's sentence says to copy the head's file). Nothing printed."""
    return ensure(path) if head else check(path)


def process_env(path: str | Path) -> dict[str, str]:
    """The environment of a Ray process that reads its token from `path` (as that process sees it)."""
    return {**MODE_ENV, "RAY_AUTH_TOKEN_PATH": str(path)}


# Every Ray process inside the trainer container (its `ray start`, launch.sh's Ray calls, the Ray job's runtime_env):
# the token through the read-only mount. polarstack.stack.exposure merges it into the trainer's environment.
TRAINER_ENV = process_env(CONTAINER_TOKEN_PATH)


def login_lines(path: Path, dashboard_port: int | str) -> list[str]:
    """How to open the trainer's dashboard in a browser, naming the token's FILE (never its text): the pinned ray's
    page asks for the token (GET /api/authentication_mode, then POST /api/authenticate, which sets the HttpOnly
    cookie ray-authentication-token; configs/upstream/ray-auth.json)."""
    return [
        f"Ray dashboard (token authentication): from your machine `ssh -L {dashboard_port}:127.0.0.1:{dashboard_port} "
        f"<node>`, open http://127.0.0.1:{dashboard_port} and paste the token from {path} on the node when the page "
        "asks (docs/exposure.md, Ray authentication)",
    ]


def auth_header(path: Path) -> dict[str, str]:
    """The Authorization header for an HTTP call this package makes to the dashboard or jobs API."""
    return {"Authorization": f"Bearer {check(path).read_text().strip()}"}
