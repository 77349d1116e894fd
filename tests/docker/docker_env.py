"""Helpers of the docker tier: the tier's own ports, and DEVICE=cpu with its own Compose project."""

from __future__ import annotations

import pytest

from polarstack.stack import device, real_sglang

TIER_PORTS = {
    "ENGINE_PORT_BASE": "33000",
    "ROUTER_PORT": "33080",
    "RAY_GCS_PORT": "33379",
    "RAY_DASHBOARD_PORT": "33265",
}
SPARE_PORTS = {
    "ENGINE_PORT_BASE": "34000",
    "ROUTER_PORT": "34080",
    "RAY_GCS_PORT": "34379",
    "RAY_DASHBOARD_PORT": "34265",
}


def cpu_environment(mp: pytest.MonkeyPatch, project: str, ports: dict[str, str], **extra: str) -> None:
    """DEVICE=cpu with the tier's own project and ports; every key set here is restored after the test."""
    mp.setenv(device.DEVICE_ENV, "cpu")
    mp.setenv("POLARSTACK_CPU_PROJECT", project)
    for key, value in {**ports, **extra}.items():
        mp.setenv(key, value)
    defaults = {
        "MODEL_DIR": str(real_sglang.model_dir()),
        "MODEL_PATH": device.CPU_MODEL_PATH,
        "ENGINE_START_PERIOD": device.CPU_ENGINE_START_PERIOD,
    }
    for key, value in defaults.items():
        if key not in extra:
            mp.setenv(key, value)  # set through the monkeypatch (main()'s apply_cpu_defaults then keeps them)
