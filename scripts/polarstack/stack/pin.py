"""`make pin`: resolve the base-image tags of configs/pins.env to digests where a registry is reachable.

Asks the registry's HTTP API (Docker Hub's token service, then a HEAD of the manifest) for each
`<X>_IMAGE` / `<X>_IMAGE_TAG` pair and writes `@sha256:...` into `<X>_IMAGE_DIGEST`. When any lookup fails
(no network, no registry) it says so and changes nothing.
"""

from __future__ import annotations

import re

import httpx

from polarstack.errors import ExitCode, StackError
from polarstack.pins import pins, repo_root

# Docker Hub's registry and token service; POLARSTACK_REGISTRY / POLARSTACK_REGISTRY_AUTH replace them, read by the
# CLI (polarstack.cli.main, `pin`) and handed to run_pin.
REGISTRY = "https://registry-1.docker.io"
AUTH = "https://auth.docker.io/token"
REGISTRY_ENV, AUTH_ENV = "POLARSTACK_REGISTRY", "POLARSTACK_REGISTRY_AUTH"
ACCEPT = ", ".join(
    [
        "application/vnd.oci.image.index.v1+json",
        "application/vnd.docker.distribution.manifest.list.v2+json",
        "application/vnd.docker.distribution.manifest.v2+json",
        "application/vnd.oci.image.manifest.v1+json",
    ]
)


def image_pins() -> list[str]:
    """Prefixes X with X_IMAGE, X_IMAGE_TAG and X_IMAGE_DIGEST in configs/pins.env."""
    table = pins()
    return [
        k[: -len("_IMAGE")] for k in table if k.endswith("_IMAGE") and f"{k}_TAG" in table and f"{k}_DIGEST" in table
    ]


def _repository(image: str) -> str:
    return image if "/" in image else f"library/{image}"


def resolve_digest(image: str, tag: str, timeout: float = 8.0, *, registry: str = REGISTRY, auth: str = AUTH) -> str:
    repo = _repository(image)
    with httpx.Client(timeout=timeout, trust_env=True) as http:
        token = http.get(auth, params={"service": "registry.docker.io", "scope": f"repository:{repo}:pull"})
        token.raise_for_status()
        headers = {"Accept": ACCEPT, "Authorization": f"Bearer {token.json()['token']}"}
        reply = http.head(f"{registry}/v2/{repo}/manifests/{tag}", headers=headers)
        reply.raise_for_status()
    digest = reply.headers.get("Docker-Content-Digest", "")
    if not re.fullmatch(r"sha256:[0-9a-f]{64}", digest):
        raise ValueError(f"no digest in the registry's answer for {image}:{tag}")
    return digest


def run_pin(registry: str = REGISTRY, auth: str = AUTH) -> dict[str, str]:
    """Each image pin's digest from `registry` (its token from `auth`: the caller's, Docker Hub's by default)."""
    table = pins()
    resolved: dict[str, str] = {}
    for prefix in image_pins():
        image, tag = table[f"{prefix}_IMAGE"], table[f"{prefix}_IMAGE_TAG"]
        try:
            resolved[f"{prefix}_IMAGE_DIGEST"] = "@" + resolve_digest(image, tag, registry=registry, auth=auth)
        except (httpx.HTTPError, ValueError, KeyError) as exc:
            raise StackError(
                f"no registry answered for {image}:{tag} ({type(exc).__name__}); configs/pins.env is "
                "unchanged: run `make pin` on a machine that reaches the registry.",
                ExitCode.ENVIRONMENT,
            ) from None
    path = repo_root() / "configs" / "pins.env"
    lines = path.read_text().splitlines(keepends=True)
    for index, line in enumerate(lines):
        key = line.split("=", 1)[0].strip()
        if key in resolved:
            lines[index] = f"{key}={resolved[key]}\n"
    path.write_text("".join(lines))
    pins.cache_clear()
    return resolved
