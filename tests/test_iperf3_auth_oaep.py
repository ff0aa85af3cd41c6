"""iperf3's RSA authentication with OAEP padding, live against stock iperf3 3.21 built
with OpenSSL (``tests/peers.py`` builds it once from shared/peers' source; build.sh's
peers have no OpenSSL): its client against ``netprobe server --iperf3`` and netprobe's
client (``netprobe run --iperf3``) against its ``iperf3 -s``, in OAEP (3.17 and later's
default) and, against its server, with ``--use-pkcs1-padding`` at both ends (3.21's
client refuses that flag); the paddings crossed are refused.
Debian's 3.12 (PKCS#1 v1.5 only) is tested in ``test_iperf3_auth.py``."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("cryptography")

from netprobe.driven import free_port
from netprobe.engine.iperf3.auth import ServerAuth, load_public_key, make_token
from tests import test_iperf3_auth
from tests.peers import iperf3_with_openssl
from tests.test_iperf3_auth import PASSWORD, USER, one_line_error
from tests.test_iperf3_client import stock_server

keys = test_iperf3_auth.keys  # the same key pair and users file fixture


@contextlib.contextmanager
def cli_server(keys: dict[str, Path], *extra: str) -> Iterator[tuple[int, list[str]]]:
    """``netprobe server --iperf3`` with the key and users file (stopped by its PID);
    yields its iperf3 port and, once stopped, the list is filled with its JSON log lines."""
    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "netprobe", "server", "-p", "0", "-B",
                               "127.0.0.1", "--iperf3", "--iperf3-port", str(port),
                               "--rsa-private-key-path", str(keys["private"]),
                               "--authorized-users-path", str(keys["users"]), *extra,
                               "--log-format", "json"],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    log: list[str] = []
    try:
        assert server.stdout is not None
        for _ in range(20):  # until it says the iperf3 listener is up
            line = server.stdout.readline()
            log.append(line)
            if '"kind": "iperf3"' in line or not line:
                break
        yield port, log
    finally:
        server.terminate()
        rest, _ = server.communicate(timeout=10)
        log.extend(rest.splitlines())


def events(log: list[str]) -> list[dict]:
    return [json.loads(line) for line in log if line.startswith("{")]


def client_321(port: int, public: Path, password: str,
               *extra: str) -> subprocess.CompletedProcess:
    """Stock 3.21's client (built with OpenSSL), one second, the password in its env."""
    return subprocess.run([iperf3_with_openssl("3.21"), "-c", "127.0.0.1", "-p", str(port),
                           "-t", "1", "--username", USER, "--rsa-public-key-path",
                           str(public), *extra], capture_output=True, text=True, timeout=30,
                          env={**os.environ, "IPERF3_PASSWORD": password},
                          stdin=subprocess.DEVNULL)


# -- stock 3.21's client against netprobe's server -----------------------------------------


@pytest.mark.peers
@pytest.mark.slow
def test_stock_321_client_with_oaep_against_our_server(keys: dict[str, Path]) -> None:
    """Its default (OAEP) with the password runs; with a wrong password it is refused
    with error 142 and the log says why, with no password in it."""
    iperf3_with_openssl("3.21")  # skip before the server starts if it cannot be built
    with cli_server(keys) as (port, log):
        good = client_321(port, keys["public"], PASSWORD)
        wrong = client_321(port, keys["public"], "wrong")
    assert good.returncode == 0, good.stdout[-1500:] + good.stderr
    assert "receiver" in good.stdout, good.stdout
    assert wrong.returncode != 0
    assert "test authorization failed" in wrong.stdout + wrong.stderr, wrong
    found = events(log)
    [refusal] = [e for e in found if e["event"] == "refused"]
    assert refusal["reason"] == "auth" and "wrong password" in refusal["message"], refusal
    assert [e["event"] for e in found].count("test-end") == 1, log
    assert PASSWORD not in "".join(log)


@pytest.mark.peers
@pytest.mark.slow
def test_stock_321_client_cannot_pad_pkcs1_and_our_pkcs1_server_refuses_it(
        keys: dict[str, Path]) -> None:
    """3.21 takes --use-pkcs1-padding on a server only (3.17.1 took it on a client too):
    its client always sends OAEP, which a --use-pkcs1-padding server refuses, naming the
    padding."""
    iperf3_with_openssl("3.21")
    with cli_server(keys, "--use-pkcs1-padding") as (port, log):
        pkcs1 = client_321(port, keys["public"], PASSWORD, "--use-pkcs1-padding")
        crossed = client_321(port, keys["public"], PASSWORD)
    assert pkcs1.returncode != 0 and "server only" in pkcs1.stderr, pkcs1
    assert crossed.returncode != 0
    assert "test authorization failed" in crossed.stdout + crossed.stderr, crossed
    found = events(log)
    [refusal] = [e for e in found if e["event"] == "refused"]
    assert refusal["reason"] == "auth" and "padding" in refusal["message"], refusal
    assert "test-end" not in [e["event"] for e in found], log


# -- netprobe's client against stock 3.21's server -----------------------------------------


def our_client(port: int, public: Path, password: str, *extra: str) -> subprocess.CompletedProcess:
    """``netprobe run 127.0.0.1 --iperf3`` with the user, the key and IPERF3_PASSWORD."""
    return subprocess.run([sys.executable, "-m", "netprobe", "run", "127.0.0.1", "--iperf3",
                           "-p", str(port), "-t", "1", "--json", "--username", USER,
                           "--rsa-public-key-path", str(public), *extra],
                          capture_output=True, text=True, timeout=60,
                          env={**os.environ, "IPERF3_PASSWORD": password},
                          stdin=subprocess.DEVNULL)


@pytest.mark.peers
@pytest.mark.slow
@pytest.mark.parametrize("padding", [(), ("--use-pkcs1-padding",)], ids=["oaep", "pkcs1"])
def test_our_client_authenticates_to_stock_321_server(keys: dict[str, Path],
                                                      padding: tuple[str, ...]) -> None:
    with stock_server(iperf3_with_openssl("3.21"), "--rsa-private-key-path",
                      str(keys["private"]), "--authorized-users-path", str(keys["users"]),
                      *padding) as server:
        out = our_client(server.port, keys["public"], PASSWORD, *padding)
        end = server.report()
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["status"] == "ok", doc.get("errors")
    [flow] = [f for f in doc["summaries"] if f["direction"] == "client_to_server"]
    assert flow["receiver"]["bytes"] == end["sum_received"]["bytes"] > 0
    assert PASSWORD not in out.stdout + out.stderr


@pytest.mark.peers
@pytest.mark.slow
@pytest.mark.parametrize(("password", "client", "server"),
                         [("wrong", (), ()),
                          (PASSWORD, (), ("--use-pkcs1-padding",)),
                          (PASSWORD, ("--use-pkcs1-padding",), ())],
                         ids=["wrong-password", "oaep-to-pkcs1", "pkcs1-to-oaep"])
def test_stock_321_server_refuses_our_client_in_one_line(
        keys: dict[str, Path], password: str, client: tuple[str, ...],
        server: tuple[str, ...]) -> None:
    """3.21 closes the connection without a word: one line that names authentication."""
    with stock_server(iperf3_with_openssl("3.21"), "--rsa-private-key-path",
                      str(keys["private"]), "--authorized-users-path", str(keys["users"]),
                      *server) as stock:
        line = one_line_error(our_client(stock.port, keys["public"], password, *client))
    assert "authentication" in line, line
    assert PASSWORD not in line


# -- the padding named, without a peer ------------------------------------------------------


@pytest.mark.parametrize("server_pkcs1", [True, False], ids=["pkcs1-server", "oaep-server"])
def test_a_token_in_the_other_padding_is_named_as_such(keys: dict[str, Path],
                                                        server_pkcs1: bool) -> None:
    """Either way round the log names the padding. PKCS#1 v1.5 decryption of an OAEP token
    does not fail where OpenSSL rejects implicitly (3.2 on, against the Marvin attack): it
    gives random text, which was reported as "not iperf3's" text."""
    auth = ServerAuth.load(str(keys["private"]), str(keys["users"]), pkcs1=server_pkcs1)
    public = load_public_key(str(keys["public"]))
    for _ in range(5):  # each token's random text differs: a few, not one lucky draw
        why = auth.check(make_token(USER, PASSWORD, public, pkcs1=not server_pkcs1))
        assert why is not None and "padding" in why, why
        assert ("uses OAEP" if server_pkcs1 else "uses PKCS#1 v1.5") in why, why
    assert auth.check(make_token(USER, PASSWORD, public, pkcs1=server_pkcs1)) is None
