"""``ki collector --tls-cert/--tls-key [--tls-client-ca]``: HTTPS with a locally made CA (issue #13 item 7)."""

from __future__ import annotations

import ssl
import subprocess
import sys

import httpx
import pytest
from pki import LocalCA
from support.collector import running_collector


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    d = tmp_path_factory.mktemp("pki")
    ca = LocalCA(d / "server-ca")
    clients = LocalCA(d / "client-ca", "ki test client CA")
    stranger = LocalCA(d / "other-ca", "someone else's CA")
    return {
        "ca": ca,
        "server": ca.issue("server", server=True),
        "client_ca": clients,
        "client": clients.issue("client", server=False),
        "foreign_client": stranger.issue("foreign", server=False),
    }


def _trusting(ca_file, cert=None) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(ca_file))
    if cert is not None:
        ctx.load_cert_chain(*cert.pair)
    return ctx


def test_https_is_served_to_clients_that_trust_the_ca_and_refused_by_those_that_do_not(tmp_path, pki):
    server = pki["server"]
    with running_collector(tmp_path, "--tls-cert", str(server.cert), "--tls-key", str(server.key)) as c:
        assert c.url.startswith("https://127.0.0.1:")
        auth = {"Authorization": f"Bearer {c.read_token}"}
        r = httpx.get(
            f"{c.url}/v1/health/snapshot", headers=auth, verify=_trusting(pki["ca"].cert), timeout=10
        )
        assert r.status_code == 200, r.text
        # The hostname is checked too: the certificate names localhost and 127.0.0.1.
        local = c.url.replace("127.0.0.1", "localhost")
        assert httpx.get(f"{local}/healthz", verify=_trusting(pki["ca"].cert), timeout=10).status_code == 200
        with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
            httpx.get(f"{c.url}/healthz", timeout=10)  # the system trust store does not know this CA
        with pytest.raises(httpx.HTTPError):  # plain HTTP to the TLS port gets no HTTP answer
            httpx.get(c.url.replace("https://", "http://") + "/healthz", timeout=10)


def test_client_certificates_are_required_with_tls_client_ca(tmp_path, pki):
    server, client = pki["server"], pki["client"]
    args = ["--tls-cert", str(server.cert), "--tls-key", str(server.key)]
    args += ["--tls-client-ca", str(pki["client_ca"].cert)]
    with running_collector(tmp_path, *args, probe_cert=client.pair) as c:
        auth = {"Authorization": f"Bearer {c.read_token}"}
        ok = httpx.get(
            f"{c.url}/v1/health/snapshot", headers=auth, verify=_trusting(pki["ca"].cert, client), timeout=10
        )
        assert ok.status_code == 200, ok.text
        for cert in (
            None,
            pki["foreign_client"],
        ):  # no certificate; one from a CA the collector does not trust
            with pytest.raises(httpx.HTTPError):
                httpx.get(f"{c.url}/healthz", verify=_trusting(pki["ca"].cert, cert), timeout=10)
        # The bearer token is still required on top of the certificate.
        bare = httpx.get(f"{c.url}/v1/health/snapshot", verify=_trusting(pki["ca"].cert, client), timeout=10)
        assert bare.status_code == 401


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--tls-cert", "CERT"], "needs both --tls-cert and --tls-key"),
        (["--tls-client-ca", "CERT"], "--tls-client-ca needs --tls-cert and --tls-key"),
        (["--tls-cert", "CERT", "--tls-key", "CERT"], "cannot load the TLS certificate"),
    ],
)
def test_bad_tls_options_are_a_clear_error(tmp_path, pki, args, message):
    cert = str(pki["server"].cert)
    argv = [
        sys.executable,
        "-m",
        "kernel_insight.cli",
        "collector",
        "--store",
        str(tmp_path / "d"),
        "--port",
        "0",
    ]
    r = subprocess.run(
        [*argv, *(cert if a == "CERT" else a for a in args)], capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 2
    assert message in r.stderr
    assert "Traceback" not in r.stderr
