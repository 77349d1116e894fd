"""The router catalog: which sglang-router / smg releases exist for the stack and what each accepts (pure data).

It encodes what ../shared/reference/router-behavior.md measured with the real PyPI wheels: which launch module a
package uses, which flags a release accepts, and whether it exposes the worker API slime registers engines through
(`POST /workers`) and current Polar discovers workers with (`GET /workers`). Unmeasured releases get the rule of
their neighbours and are marked `measured=False`. Reading it imports no process or HTTP machinery (profiles reads
it); the installer and the harness that runs a release are in polarstack.routers.harness.
"""

from __future__ import annotations

from dataclasses import dataclass

from polarstack.errors import ExitCode, StackError

PACKAGES = ("sglang-router", "smg")
LAUNCH_MODULES = {"sglang-router": "sglang_router.launch_router", "smg": "smg.launch_router"}

# (package, version) pairs router-behavior.md reports measurements for.
MEASURED = {
    ("sglang-router", v)
    for v in ("0.1.0", "0.1.4", "0.1.5", "0.1.9", "0.2.0", "0.2.3", "0.2.4", "0.3.0", "0.3.1", "0.3.2")
} | {("smg", v) for v in ("1.3.3", "1.4.0", "1.4.1", "1.5.0", "1.6.0", "1.8.0", "1.13.0")}


def version_tuple(version: str) -> tuple[int, ...]:
    parts = []
    for piece in version.split("."):
        digits = "".join(ch for ch in piece if ch.isdigit())
        parts.append(int(digits) if digits else 0)
    return tuple(parts)


@dataclass(frozen=True)
class RouterRelease:
    package: str
    version: str

    def __post_init__(self) -> None:
        if self.package not in PACKAGES:
            raise StackError(
                f"unknown router package {self.package!r}; use one of {', '.join(PACKAGES)}.", ExitCode.USAGE
            )
        if not self.version or not self.version[0].isdigit():
            raise StackError(f"router version {self.version!r} is not a release number.", ExitCode.USAGE)

    @classmethod
    def parse(cls, spec: str) -> "RouterRelease":
        """`PACKAGE==VERSION`, for example `sglang-router==0.1.0`."""
        package, sep, version = spec.partition("==")
        if not sep:
            raise StackError(
                f"router release {spec!r} must look like PACKAGE==VERSION (sglang-router==X.Y.Z or smg==X.Y.Z).",
                ExitCode.USAGE,
            )
        return cls(package.strip(), version.strip())

    @property
    def spec(self) -> str:
        return f"{self.package}=={self.version}"

    @property
    def module(self) -> str:
        return LAUNCH_MODULES[self.package]

    @property
    def measured(self) -> bool:
        return (self.package, self.version) in MEASURED

    @property
    def v(self) -> tuple[int, ...]:
        return version_tuple(self.version)

    # --- flags the release accepts (router-behavior.md, "Command lines that work") -----------------------
    @property
    def accepts_startup_check_interval(self) -> bool:
        # 0.1.0 rejects --worker-startup-check-interval; 0.1.4 accepts it (0.1.1-0.1.3 unmeasured).
        return self.package == "smg" or self.v >= (0, 1, 4)

    @property
    def accepts_prometheus_port(self) -> bool:
        return self.package == "smg" or self.v >= (0, 1, 5)

    @property
    def policies(self) -> tuple[str, ...]:
        """`--policy` choices of the release (its own `--help`, read 2026-11-30 for the pinned releases);
        empty when not read. docs/routing.md measures what each does with an agent workload."""
        if self.package == "smg" and self.v == (1, 13, 0):
            return (
                "random",
                "round_robin",
                "passthrough",
                "cache_aware",
                "power_of_two",
                "least_load",
                "manual",
                "consistent_hashing",
                "prefix_hash",
            )
        if self.package == "sglang-router" and self.v == (0, 3, 2):
            return ("random", "round_robin", "cache_aware", "power_of_two", "manual")
        if self.package == "sglang-router" and self.v == (0, 1, 4):
            return ("random", "round_robin", "cache_aware")
        return ()

    @property
    def accepts_prometheus_host(self) -> bool:
        """--prometheus-host: in every release with --prometheus-port (configs/upstream/router-prometheus-host.json,
        read from each release's own parser). Its default is 0.0.0.0 from sglang-router 0.2.0 and in smg (1.13.0:
        None, bound as 0.0.0.0), so the stack always passes 127.0.0.1."""
        return self.accepts_prometheus_port

    # --- APIs ------------------------------------------------------------------------------------------
    @property
    def forwards_unknown_chat_fields(self) -> bool:
        """Do Polar's return_* chat request fields reach the engine? (the measured table's column 1)"""
        if self.package == "smg":
            return self.v >= (1, 5, 0)  # smg PR #1130, the catch-all on ChatCompletionRequest
        return self.v <= (0, 1, 4)

    @property
    def has_worker_api(self) -> bool:
        """`POST /workers` / `GET /workers` (slime's registration API; current Polar's discovery)."""
        if self.package == "smg":
            return self.v >= (1, 5, 0)
        return self.v >= (0, 3, 0)

    def launch_args(
        self,
        port: int,
        worker_urls: list[str],
        prometheus_port: int | None,
        extra: list[str] | None = None,
        host: str = "127.0.0.1",
    ) -> list[str]:
        """`host`: the address the router serves on (the head's cluster address at NODES>1, polarstack.stack.cluster);
        its metrics endpoint stays on loopback either way."""
        args = ["-m", self.module, "--host", host, "--port", str(port)]
        if worker_urls:
            args += ["--worker-urls", *worker_urls]
        if self.accepts_startup_check_interval:
            args += ["--worker-startup-check-interval", "1"]
        if self.accepts_prometheus_port and prometheus_port is not None:
            args += ["--prometheus-port", str(prometheus_port)]
        if self.accepts_prometheus_host and prometheus_port is not None:
            args += ["--prometheus-host", "127.0.0.1"]  # the metrics endpoint stays on loopback too
        return args + list(extra or [])
