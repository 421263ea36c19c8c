"""The --tls-* options of every service: resolved like every option (flag, environment,
config file) and refused at start, naming the option, when they do not fit together."""

from __future__ import annotations

from pathlib import Path

import pytest

from tide.certs import make_ca, make_leaf
from tide.client import Admin, InvalidArgument, Producer
from tide.server import load_config
from tide.server._bootstrap import ServerTls, tls_from_config
from tide.tls import TlsError, TlsFiles


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> TlsFiles:
    root = tmp_path_factory.mktemp("certs")
    leaf = make_leaf(make_ca(root), root, "service")
    return TlsFiles(str(leaf.cert_file), str(leaf.key_file), str(leaf.ca_file))


def test_plaintext_without_options() -> None:
    assert tls_from_config(load_config("nameserver", (), [])) is None


def test_flags_environment_and_config_file(
    files: TlsFiles, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert files.cert_file and files.key_file and files.ca_file
    by_flag = load_config(
        "storage",
        (),
        ["--tls-cert-file", files.cert_file, "--tls-key-file", files.key_file,
         "--tls-ca-file", files.ca_file, "--tls-reload-interval-ms", "250"]
    )  # fmt: skip
    assert tls_from_config(by_flag) == ServerTls(files, 250)
    environ = {
        "TIDE_GATEWAY_TLS_CERT_FILE": files.cert_file,
        "TIDE_GATEWAY_TLS_KEY_FILE": files.key_file,
        "TIDE_GATEWAY_TLS_CA_FILE": files.ca_file,
    }
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    assert tls_from_config(load_config("gateway", (), [])) == ServerTls(files, 5_000)
    toml = tmp_path / "dispatch.toml"
    toml.write_text(
        f'tls_cert_file = "{files.cert_file}"\ntls_key_file = "{files.key_file}"\n'
        f'tls_ca_file = "{files.ca_file}"\n'
    )
    from_file = load_config("dispatch", (), ["--config", str(toml)])
    assert tls_from_config(from_file) == ServerTls(files, 5_000)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--tls-cert-file", "C"], "--tls-cert-file and --tls-key-file"),
        (["--tls-ca-file", "CA"], "needs --tls-cert-file and --tls-key-file"),
        (["--tls-cert-file", "C", "--tls-key-file", "K"], "needs --tls-ca-file"),
        (["--tls-cert-file", "/nonexistent.crt", "--tls-key-file", "K", "--tls-ca-file", "A"],
         "--tls-cert-file: cannot read /nonexistent.crt"),
        (["--tls-cert-file", "C", "--tls-key-file", "K", "--tls-ca-file", "A",
          "--tls-reload-interval-ms", "0"], "--tls-reload-interval-ms: 0 is outside"),
    ],
)  # fmt: skip
def test_bad_combinations_name_the_option(argv: list[str], message: str) -> None:
    config = load_config("storage", (), argv)
    with pytest.raises(TlsError, match=message):
        tls_from_config(config)


def test_client_tls_errors_name_the_field(tmp_path: Path) -> None:
    missing = str(tmp_path / "missing.pem")
    with pytest.raises(InvalidArgument, match=r"TlsFiles\.ca_file: cannot read .*missing\.pem"):
        Producer("127.0.0.1:1", tls=TlsFiles(ca_file=missing))
    with pytest.raises(InvalidArgument, match=r"TlsFiles\.cert_file and TlsFiles\.key_file"):
        Admin("127.0.0.1:1", tls=TlsFiles(cert_file=missing))
