"""The exporter's own endpoint: TLS and basic auth from a web config file.

The file follows Prometheus' exporter-toolkit (``--web.config.file``), so one file serves
prefixwatch and node_exporter alike::

    tls_server_config:
      cert_file: /etc/prefixwatch/tls.crt
      key_file: /etc/prefixwatch/tls.key
    basic_auth_users:
      prometheus: $2y$10$...   # bcrypt hash (htpasswd -nBC 10 "" | tr -d ':\\n')
"""

from __future__ import annotations

import base64
import hashlib
import ssl
import threading
from dataclasses import dataclass, field
from pathlib import Path

from prefixwatch.core.errors import ConfigError
from prefixwatch.core.yamlfile import ConfigFile

_TOP_KEYS = {"tls_server_config", "basic_auth_users", "http_server_config"}
_TLS_KEYS = {"cert_file", "key_file", "client_ca_file", "min_version"}
_VERSIONS = {"TLS12": ssl.TLSVersion.TLSv1_2, "TLS13": ssl.TLSVersion.TLSv1_3}


@dataclass
class WebConfig:
    """What the exporter's HTTP server enforces: TLS (a context) and basic-auth users."""

    ssl_context: ssl.SSLContext | None = None
    users: dict[str, bytes] = field(default_factory=dict)  # user -> bcrypt hash
    _verified: set[bytes] = field(default_factory=set)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def allows(self, authorization: str | None) -> bool:
        """True when no users are configured or the Basic credentials match a user.

        bcrypt is slow on purpose; a credential that passed once is remembered by its
        SHA-256 (never in clear) so Prometheus' scrapes every few seconds cost a hash."""
        if not self.users:
            return True
        if not authorization or not authorization.startswith("Basic "):
            return False
        digest = hashlib.sha256(authorization.encode()).digest()
        with self._lock:
            if digest in self._verified:
                return True
        try:
            user, _, password = base64.b64decode(authorization[6:].strip(),
                                                 validate=True).decode().partition(":")
        except (ValueError, UnicodeDecodeError):
            return False
        hashed = self.users.get(user)
        if hashed is None:
            return False
        import bcrypt

        try:
            ok = bcrypt.checkpw(password.encode(), hashed)
        except ValueError:
            return False
        if ok:
            with self._lock:
                if len(self._verified) > 64:
                    self._verified.clear()
                self._verified.add(digest)
        return ok


def load_web_config(path: str) -> WebConfig:
    """Read and check a web config file; ConfigError (one line) on anything wrong."""
    data = ConfigFile.load(path, "web config file").data
    where = f"web config file {path!r}"
    unknown = set(data) - _TOP_KEYS
    if unknown:
        raise ConfigError(f"{where}: unknown key {sorted(unknown)[0]!r}")
    config = WebConfig()
    tls = data.get("tls_server_config")
    if tls is not None:
        config.ssl_context = _tls_context(tls, where, Path(path).parent)
    users = data.get("basic_auth_users") or {}
    if not isinstance(users, dict):
        raise ConfigError(f"{where}: basic_auth_users must be a mapping of user: bcrypt hash")
    if users:
        try:
            import bcrypt  # noqa: F401 - checked now, not at the first scrape
        except ImportError:
            raise ConfigError(f"{where}: basic_auth_users needs the bcrypt package "
                              "(pip install 'prefixwatch[web]')") from None
    for user, hashed in users.items():
        if not isinstance(hashed, str) or not hashed.startswith(("$2a$", "$2b$", "$2y$")):
            raise ConfigError(f"{where}: the password of user {str(user)!r} is not a bcrypt "
                              "hash")
        config.users[str(user)] = hashed.encode()
    return config


def _tls_context(tls: object, where: str, base: Path) -> ssl.SSLContext:
    if not isinstance(tls, dict):
        raise ConfigError(f"{where}: tls_server_config must be a mapping")
    unknown = set(tls) - _TLS_KEYS
    if unknown:
        raise ConfigError(f"{where}: unknown tls_server_config key {sorted(unknown)[0]!r}")
    if not tls.get("cert_file") or not tls.get("key_file"):
        raise ConfigError(f"{where}: tls_server_config needs cert_file and key_file")
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    version = str(tls.get("min_version", "TLS12"))
    if version not in _VERSIONS:
        raise ConfigError(f"{where}: min_version must be one of {', '.join(_VERSIONS)}")
    ctx.minimum_version = _VERSIONS[version]

    def resolve(name: str) -> str:
        return str(base / str(tls[name]))  # relative to the file, as exporter-toolkit does

    try:
        ctx.load_cert_chain(resolve("cert_file"), resolve("key_file"))
        if tls.get("client_ca_file"):
            ctx.load_verify_locations(resolve("client_ca_file"))
            ctx.verify_mode = ssl.CERT_REQUIRED
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"{where}: cannot load the TLS files: "
                          f"{getattr(exc, 'strerror', None) or exc}") from exc
    return ctx
