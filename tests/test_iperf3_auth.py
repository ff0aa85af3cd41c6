"""iperf3's RSA authentication, both ends: Debian's stock iperf3 3.12 (built with OpenSSL,
PKCS#1 v1.5 padding) as a client of ``netprobe server --iperf3 --rsa-private-key-path``
and as an ``iperf3 -s`` that netprobe's client authenticates to; OAEP between netprobe's
own two ends (a stock 3.21 built with OpenSSL: test_iperf3_auth_oaep.py); bad tokens,
old and replayed timestamps, a bounded fuzz, and the command lines' one-line errors."""

from __future__ import annotations

import base64
import contextlib
import json
import os
import random
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

cryptography = pytest.importorskip("cryptography")

from cryptography.hazmat.primitives import serialization  # noqa: E402
from cryptography.hazmat.primitives.asymmetric import rsa  # noqa: E402

from netprobe.driven import free_port  # noqa: E402
from netprobe.engine.iperf3 import wire  # noqa: E402
from netprobe.engine.iperf3.auth import (  # noqa: E402
    AuthError,
    ClientAuth,
    ServerAuth,
    load_public_key,
    make_token,
    password_hash,
    read_users,
)
from netprobe.errors import TestFailed  # noqa: E402
from netprobe.plugin import NullReporter  # noqa: E402
from netprobe.schema import TestSpec  # noqa: E402
from netprobe.tools.native import NativeTool  # noqa: E402
from tests.peers import stock_iperf3  # noqa: E402
from tests.test_iperf3_client import one_line_error, stock_server  # noqa: E402
from tests.test_iperf3_server import COOKIE, Running  # noqa: E402

USER = "alice"
PASSWORD = "s3cret-Pw.42"  # never to be seen in a log


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A 2048-bit key pair (PEM: the private key as PKCS#8, the public as ``openssl rsa
    -pubout`` writes it) and an authorized-users file listing alice (and a comment)."""
    folder = tmp_path_factory.mktemp("keys")
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    private = folder / "private.pem"
    private.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                          serialization.PrivateFormat.PKCS8,
                                          serialization.NoEncryption()))
    public = folder / "public.pem"
    public.write_bytes(key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    users = folder / "users.csv"
    users.write_text(f"# users\r\nbob,{password_hash('bob', 'other')}\r\n"
                     f"{USER},{password_hash(USER, PASSWORD)}\r\n")
    return {"private": private, "public": public, "users": users}


def server_auth(keys: dict[str, Path], pkcs1: bool, skew_s: int = 10) -> ServerAuth:
    return ServerAuth.load(str(keys["private"]), str(keys["users"]), pkcs1, skew_s)


def no_secret_in(srv: Running) -> None:
    """Neither the password nor any part of a token is in the server's log."""
    text = json.dumps([(m, {k: str(v) for k, v in f.items()}) for _, m, f in srv.log])
    assert PASSWORD not in text, text


def stock_client(port: int, user: str, password: str, public: Path,
                 srv: Running | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "IPERF3_PASSWORD": password}
    try:
        return subprocess.run([stock_iperf3("3.12"), "-c", "127.0.0.1", "-p", str(port),
                               "-t", "1", "--username", user, "--rsa-public-key-path",
                               str(public)], capture_output=True, text=True, timeout=30,
                              env=env, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired as exc:
        raise AssertionError(f"the stock client hung; server log: "
                             f"{srv.log if srv else None}") from exc


# -- a stock client against netprobe's server -------------------------------------------


@pytest.mark.peers
def test_stock_312_client_with_a_good_user_runs(keys: dict[str, Path]) -> None:
    with Running() as srv:
        srv.service.auth = server_auth(keys, pkcs1=True)  # 3.12 pads PKCS#1 v1.5
        out = stock_client(srv.port, USER, PASSWORD, keys["public"], srv)
        assert out.returncode == 0, out.stdout[-1500:] + out.stderr
        assert srv.wait_idle()
    assert len(srv.results) == 1
    assert srv.results[0].summaries[0].receiver is not None
    assert srv.service.counters["served"] == 1
    no_secret_in(srv)


@pytest.mark.peers
@pytest.mark.parametrize(("user", "password", "why"),
                         [(USER, "wrong", "wrong password"),
                          ("mallory", PASSWORD, "not in the authorized users file")])
def test_stock_312_client_with_bad_credentials_is_refused(keys: dict[str, Path], user: str,
                                                          password: str, why: str) -> None:
    with Running() as srv:
        srv.service.auth = server_auth(keys, pkcs1=True)
        out = stock_client(srv.port, user, password, keys["public"], srv)
        assert srv.wait_idle()
    assert out.returncode != 0
    assert "authorization failed" in out.stdout + out.stderr, out.stdout + out.stderr
    [(_, message, fields)] = srv.events("refused")
    assert fields["reason"] == "auth" and fields["code"] == wire.IEAUTHTEST
    assert why in message, message
    assert srv.results == [] and srv.service.counters["refused"] == 1
    no_secret_in(srv)


@pytest.mark.peers
def test_a_padding_the_server_does_not_use_is_refused_and_named(
        keys: dict[str, Path]) -> None:
    # 3.12 pads PKCS#1 v1.5; a server expecting OAEP (3.17 and later's default) refuses it.
    with Running() as srv:
        srv.service.auth = server_auth(keys, pkcs1=False)
        out = stock_client(srv.port, USER, PASSWORD, keys["public"], srv)
        assert srv.wait_idle()
    assert out.returncode != 0
    [(_, message, _fields)] = srv.events("refused")
    assert "padding" in message, message


# -- netprobe's client against a stock server --------------------------------------------


def auth_run(port: int, auth: ClientAuth, **fields: Any) -> Any:
    spec = TestSpec(host="127.0.0.1", port=port, **{"duration_s": 1.0, **fields})
    return NativeTool({"iperf3": True, "iperf3_auth": auth}).run(spec, NullReporter())


@pytest.mark.peers
def test_our_client_authenticates_to_stock_312_server(keys: dict[str, Path]) -> None:
    with stock_server(stock_iperf3("3.12"), "--rsa-private-key-path", str(keys["private"]),
                      "--authorized-users-path", str(keys["users"])) as server:
        result = auth_run(server.port, ClientAuth.load(USER, PASSWORD, str(keys["public"]),
                                                       pkcs1=True))
        end = server.report()
    assert result.status == "ok", result.errors
    received = result.summary("client_to_server")
    assert received is not None and received.receiver is not None
    assert received.receiver.bytes == end["sum_received"]["bytes"] > 0


@pytest.mark.peers
@pytest.mark.parametrize(("user", "password"), [(USER, "wrong"), ("mallory", PASSWORD)])
def test_stock_312_server_refuses_our_client_with_bad_credentials(
        keys: dict[str, Path], user: str, password: str) -> None:
    auth = ClientAuth.load(user, password, str(keys["public"]), pkcs1=True)
    with stock_server(stock_iperf3("3.12"), "--rsa-private-key-path", str(keys["private"]),
                      "--authorized-users-path", str(keys["users"])) as server, \
            pytest.raises(TestFailed, match="authorization failed"):
        auth_run(server.port, auth)


# -- OAEP: netprobe's two ends (the stock 3.21 peer: test_iperf3_auth_oaep.py) ---------


@pytest.mark.parametrize(("client_pkcs1", "server_pkcs1"),
                         [(False, False), (True, True), (False, True), (True, False)])
def test_our_client_and_server_agree_on_the_padding(keys: dict[str, Path],
                                                    client_pkcs1: bool,
                                                    server_pkcs1: bool) -> None:
    auth = ClientAuth.load(USER, PASSWORD, str(keys["public"]), client_pkcs1)
    with Running() as srv:
        srv.service.auth = server_auth(keys, server_pkcs1)
        if client_pkcs1 == server_pkcs1:
            result = auth_run(srv.port, auth)
            assert result.status == "ok", result.errors
            with pytest.raises(TestFailed, match="iperf3 error 142"):  # no token: refused
                NativeTool({"iperf3": True}).run(TestSpec(host="127.0.0.1", port=srv.port,
                                                          duration_s=1.0), NullReporter())
        else:
            with pytest.raises(TestFailed, match="iperf3 error 142"):
                auth_run(srv.port, auth)
        assert srv.wait_idle()
    assert len(srv.results) == (1 if client_pkcs1 == server_pkcs1 else 0)
    no_secret_in(srv)


# -- tokens on the wire --------------------------------------------------------------------


def send_params(port: int, params: dict) -> tuple[int, int | None]:
    """A control connection that sends ``params``; the state that answers (and the error
    code after SERVER_ERROR)."""
    with contextlib.closing(socket.create_connection(("127.0.0.1", port), timeout=10)) as s:
        s.sendall(COOKIE)
        assert wire.read_state(s) == wire.PARAM_EXCHANGE
        wire.send_json(s, params)
        state = wire.read_state(s)
        code = wire.read_error(s)[0] if state == wire.SERVER_ERROR else None
        return state, code


PARAMS = {"tcp": True, "time": 1, "parallel": 1, "len": 1000}


def test_old_future_and_replayed_tokens_are_refused(keys: dict[str, Path]) -> None:
    key = load_public_key(str(keys["public"]))
    with Running(handshake_timeout_s=1.0) as srv:
        srv.service.auth = server_auth(keys, pkcs1=False, skew_s=10)
        for stamp, words in ((time.time() - 60, "60 s old"), (time.time() + 60, "ahead")):
            token = make_token(USER, PASSWORD, key, False, now=stamp)
            assert send_params(srv.port, {**PARAMS, "authtoken": token}) == (
                wire.SERVER_ERROR, wire.IEAUTHTEST)
            assert words in srv.events("refused")[-1][1]
        token = make_token(USER, PASSWORD, key, False)
        # The first use passes (CREATE_STREAMS); the same token again is a replay.
        assert send_params(srv.port, {**PARAMS, "authtoken": token})[0] == wire.CREATE_STREAMS
        assert srv.wait_idle()
        assert send_params(srv.port, {**PARAMS, "AuthToken": token}) == (
            wire.SERVER_ERROR, wire.IEAUTHTEST)
        assert "replay" in srv.events("refused")[-1][1]
        assert send_params(srv.port, PARAMS) == (wire.SERVER_ERROR, wire.IEAUTHTEST)
        assert "no authtoken" in srv.events("refused")[-1][1]
        assert srv.wait_idle()
    no_secret_in(srv)


def test_without_auth_configured_a_token_is_still_refused(keys: dict[str, Path]) -> None:
    token = make_token(USER, PASSWORD, load_public_key(str(keys["public"])), False)
    with Running() as srv:
        assert send_params(srv.port, {**PARAMS, "authtoken": token}) == (
            wire.SERVER_ERROR, wire.IEAUTHTEST)
        assert "--rsa-private-key-path" in srv.events("refused")[-1][1]
        assert srv.wait_idle()


def _bad_token(rng: random.Random, key_bytes: int) -> object:
    kind = rng.randrange(8)
    if kind == 0:
        return base64.b64encode(rng.randbytes(key_bytes)).decode()  # right size, junk
    if kind == 1:
        return base64.b64encode(rng.randbytes(rng.randrange(0, 600))).decode()
    if kind == 2:
        return "".join(chr(rng.randrange(1, 0x2FF)) for _ in range(rng.randrange(0, 400)))
    if kind == 3:
        return "A" * rng.choice([4000, 7000])  # as big as the 8 KiB params allow
    if kind == 4:
        return rng.choice([None, 7, 1.5, [], {"a": 1}, True])
    if kind == 5:
        return base64.b64encode(rng.randbytes(key_bytes)).decode()[:-3] + "!=="
    if kind == 6:
        return ""
    return "\n".join(base64.b64encode(rng.randbytes(key_bytes)).decode()[i:i + 64]
                     for i in range(0, 344, 64))  # base64 with line breaks


def test_bad_tokens_never_crash_or_stick_a_slot(keys: dict[str, Path],
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """Bounded fuzz: 80 malformed tokens are each refused with 142 (no thread dies), every
    slot comes back, and a good client runs after them."""
    died: list[str] = []
    monkeypatch.setattr(threading, "excepthook",
                        lambda args: died.append(f"{args.exc_type.__name__}: {args.exc_value}"))
    rng = random.Random(142)
    with Running(max_tests=1) as srv:
        srv.service.auth = server_auth(keys, pkcs1=False)
        for _ in range(80):
            token = _bad_token(rng, 256)
            assert send_params(srv.port, {**PARAMS, "authtoken": token}) == (
                wire.SERVER_ERROR, wire.IEAUTHTEST), token
        assert srv.wait_idle()
        assert srv.service.counters["refused"] == 80
        result = auth_run(srv.port, ClientAuth.load(USER, PASSWORD, str(keys["public"])))
        assert result.status == "ok", result.errors
        assert srv.wait_idle()
    assert died == []
    assert {f["reason"] for _, _, f in srv.events("refused")} == {"auth"}


# -- the files, as iperf3 reads them --------------------------------------------------------


def test_users_file_is_read_as_iperf3_reads_it(tmp_path: Path) -> None:
    users = tmp_path / "users.csv"
    users.write_bytes(b"#carol,x\n\nnocomma\r\n,,dave,HASH,extra\r\neve,\nfrank,h1\nfrank,h2\n")
    assert read_users(str(users)) == {"dave": "hash", "frank": "h1"}


def test_unusable_key_files_are_one_line_errors(tmp_path: Path, keys: dict[str, Path]) -> None:
    junk = tmp_path / "junk.pem"
    junk.write_text("not a key\n")
    for path in (tmp_path / "absent.pem", junk, keys["public"]):
        with pytest.raises(AuthError) as caught:
            ServerAuth.load(str(path), str(keys["users"]))
        assert "\n" not in str(caught.value)
    with pytest.raises(AuthError, match="without spaces"):
        ClientAuth.load("two words", PASSWORD, str(keys["public"]))
    with pytest.raises(AuthError):
        ClientAuth.load(USER, PASSWORD, str(keys["private"]))  # not a public key


# -- the command lines -------------------------------------------------------------------------


def netprobe(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "netprobe", *args], capture_output=True,
                          text=True, timeout=60, env=env, stdin=subprocess.DEVNULL)


def test_server_refuses_to_start_with_an_unusable_key(tmp_path: Path,
                                                      keys: dict[str, Path]) -> None:
    base = ["server", "-B", "127.0.0.1", "-p", "0", "--iperf3", "--iperf3-port", "0"]
    line = one_line_error(netprobe(*base, "--rsa-private-key-path", str(tmp_path / "none"),
                                   "--authorized-users-path", str(keys["users"])))
    assert "cannot read the RSA private key file" in line, line
    line = one_line_error(netprobe(*base, "--rsa-private-key-path", str(keys["private"])))
    assert "both" in line, line
    line = one_line_error(netprobe(*base[:-3], "--rsa-private-key-path", str(keys["private"]),
                                   "--authorized-users-path", str(keys["users"])))
    assert "--iperf3" in line, line


def test_run_needs_the_password_in_the_environment(keys: dict[str, Path]) -> None:
    env = {k: v for k, v in os.environ.items() if k != "IPERF3_PASSWORD"}
    line = one_line_error(netprobe("run", "127.0.0.1", "--iperf3", "-p", str(free_port()),
                                   "--username", USER, "--rsa-public-key-path",
                                   str(keys["public"]), env=env))
    assert "IPERF3_PASSWORD" in line, line
    line = one_line_error(netprobe("run", "127.0.0.1", "--username", USER,
                                   "--rsa-public-key-path", str(keys["public"]), env=env))
    assert "--iperf3" in line, line


@pytest.mark.peers
def test_cli_server_with_auth_serves_a_stock_client(keys: dict[str, Path]) -> None:
    """`netprobe server --iperf3 --rsa-private-key-path --authorized-users-path
    --use-pkcs1-padding`: stock 3.12 with the password runs, with a wrong one is refused
    with a logged reason "auth" that holds no password."""
    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "netprobe", "server", "-p", "0", "-B",
                               "127.0.0.1", "--iperf3", "--iperf3-port", str(port),
                               "--rsa-private-key-path", str(keys["private"]),
                               "--authorized-users-path", str(keys["users"]),
                               "--use-pkcs1-padding", "--log-format", "json"],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        assert server.stdout is not None
        for _ in range(20):
            line = server.stdout.readline()
            if '"kind": "iperf3"' in line or not line:
                break
        good = stock_client(port, USER, PASSWORD, keys["public"])
        bad = stock_client(port, USER, "wrong", keys["public"])
    finally:
        server.terminate()
        rest, _ = server.communicate(timeout=10)
    assert good.returncode == 0, good.stdout + good.stderr
    assert bad.returncode != 0
    events = [json.loads(line) for line in rest.splitlines() if line.startswith("{")]
    assert [e.get("reason") for e in events if e["event"] == "refused"] == ["auth"], rest
    assert "test-end" in [e["event"] for e in events], rest
    assert PASSWORD not in rest


def test_cli_run_authenticates_and_shows_no_password(keys: dict[str, Path]) -> None:
    env = {**os.environ, "IPERF3_PASSWORD": PASSWORD}
    with Running() as srv:
        srv.service.auth = server_auth(keys, pkcs1=False)
        out = netprobe("run", "127.0.0.1", "--iperf3", "-p", str(srv.port), "-t", "1",
                       "--json", "--username", USER, "--rsa-public-key-path",
                       str(keys["public"]), env=env)
        assert srv.wait_idle()
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["status"] == "ok"
    assert PASSWORD not in out.stdout + out.stderr
    assert len(srv.results) == 1


def test_a_server_that_closes_on_the_token_is_named_as_the_cause(
        keys: dict[str, Path]) -> None:
    """iperf3 3.21 closes the control connection without a word on a bad token: the
    client's error says authentication may be why."""
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]

    def bare_close() -> None:
        conn, _ = listener.accept()
        with conn:
            conn.settimeout(10)
            wire.recv_exact(conn, wire.COOKIE_BYTES)
            wire.send_state(conn, wire.PARAM_EXCHANGE)
            wire.read_json(conn, wire.MAX_PARAMS_BYTES)

    thread = threading.Thread(target=bare_close, daemon=True)
    thread.start()
    try:
        with pytest.raises(TestFailed, match=r"closed the control connection "
                                             r"\(authentication failed\?\)"):
            auth_run(port, ClientAuth.load(USER, PASSWORD, str(keys["public"])))
    finally:
        thread.join(10)
        listener.close()


def test_private_keys_in_both_pem_forms_load_and_a_passphrase_is_named(
        tmp_path: Path, keys: dict[str, Path]) -> None:
    key = serialization.load_pem_private_key(keys["private"].read_bytes(), password=None)
    assert isinstance(key, rsa.RSAPrivateKey)
    forms = {"rsa.pem": (serialization.PrivateFormat.TraditionalOpenSSL,
                         serialization.NoEncryption()),
             "locked.pem": (serialization.PrivateFormat.PKCS8,
                            serialization.BestAvailableEncryption(b"passphrase"))}
    for name, (form, lock) in forms.items():
        (tmp_path / name).write_bytes(key.private_bytes(serialization.Encoding.PEM, form,
                                                        lock))
    assert (tmp_path / "rsa.pem").read_text().startswith("-----BEGIN RSA PRIVATE KEY")
    auth = ServerAuth.load(str(tmp_path / "rsa.pem"), str(keys["users"]))
    public = load_public_key(str(keys["public"]))
    assert auth.check(make_token(USER, PASSWORD, public, False)) is None
    with pytest.raises(AuthError, match="passphrase"):
        ServerAuth.load(str(tmp_path / "locked.pem"), str(keys["users"]))
