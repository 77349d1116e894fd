#!/usr/bin/env python3
"""Container healthcheck: GET a URL; exit 0 only on a 2xx answer, else print one line saying why and exit 1.

Standard library only, so it runs in every image (engine, router, trainer) without extra packages.
Usage: polarstack-healthcheck URL [TIMEOUT_SECONDS]
"""

import sys
import urllib.error
import urllib.request


def main(argv: list[str]) -> int:
    if len(argv) not in (2, 3):
        print("usage: polarstack-healthcheck URL [TIMEOUT_SECONDS]")
        return 2
    url = argv[1]
    timeout = float(argv[2]) if len(argv) == 3 else 5.0
    request = urllib.request.Request(url, method="GET")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:  # noqa: S310 - loopback URL from compose
            status = response.status
    except urllib.error.HTTPError as exc:
        print(f"unhealthy: {url} answered HTTP {exc.code}")
        return 1
    except (urllib.error.URLError, OSError) as exc:
        print(f"unhealthy: {url} unreachable ({getattr(exc, 'reason', exc)})")
        return 1
    if not 200 <= status < 300:
        print(f"unhealthy: {url} answered HTTP {status}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
