"""Pins the private Docker engine's configuration (polarstack.stack.dockerd): never the default socket, a socket path
under the 108-byte unix limit whatever HOME's length, the data root under the cache, networks inside 198.18.0.0/15,
published ports on 127.0.0.1 only, no firewall rule changed; two caches never share a run folder."""

import ipaddress

import pytest

from polarstack.stack import dockerd

pytestmark = pytest.mark.unit
TEST_NET = ipaddress.ip_network("198.18.0.0/15")


def test_config_keeps_to_loopback_and_the_test_range(tmp_path, monkeypatch):
    long_home = tmp_path / ("h" * 200)
    monkeypatch.setenv("POLARSTACK_CACHE", str(long_home / ".cache" / "polarstack"))
    monkeypatch.delenv("POLARSTACK_DOCKER_ROOT", raising=False)
    d = dockerd.daemon()
    config = d.config()
    assert len(str(d.socket)) < 108 and d.host != "unix:///var/run/docker.sock"
    assert config["hosts"] == [d.host] and config["data-root"].startswith(str(long_home))
    assert config["iptables"] is False and config["ip-forward"] is False and config["ip"] == "127.0.0.1"
    assert ipaddress.ip_interface(config["bip"]).network.subnet_of(TEST_NET)
    for pool in config["default-address-pools"]:
        assert ipaddress.ip_network(pool["base"]).subnet_of(TEST_NET)
    assert d.exec_root.is_relative_to(d.run_root) and d.pidfile.is_relative_to(d.run_root)


def test_two_caches_get_two_run_folders(tmp_path):
    assert dockerd.daemon(tmp_path / "a").run_root != dockerd.daemon(tmp_path / "b").run_root


def test_an_engine_that_does_not_answer_is_said_so(tmp_path):
    assert dockerd.answers(f"unix://{tmp_path}/no.sock", timeout=5) is False
