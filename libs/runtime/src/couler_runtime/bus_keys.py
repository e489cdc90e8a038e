"""Bus identities: nkeys, message signatures, message ids, and the credential files.

Every service connects to NATS with its own nkey (an Ed25519 key pair in NATS's encoding:
the server's configuration holds only public keys, each service holds its seed in a file
of mode 0600) and signs what it publishes; consumers verify that a message is signed by
an owner of its subject (:func:`couler_runtime.bus_access.owners`) with the public keys in
the trust file. What is signed (:func:`signing_input`): the subject, the headers that say
what the message is (msg id, type, source, time, tenant, run, payload reference, signer)
and the sha256 of the body -- of the stored body when it travels by reference.

Message ids are deterministic per publisher but not guessable by anyone else
(:meth:`BusIdentity.msg_id`): ``<key>.<tag>`` where the tag is an HMAC of subject and key
under a secret derived from the publisher's seed. JetStream drops a repeated id in a
whole stream, so a predictable id would let any publisher on that stream suppress
another's event by sending first.

:class:`BusFiles` is the directory ``couler up`` (or ``couler credentials init``) writes::

    <dir>/keys/<identity>.nk    the seed of each identity (0600)
    <dir>/trust.json            identity -> public key (what consumers verify against)
    <dir>/nats.conf             the server's authorization (and TLS) configuration
    <dir>/tls/                  a CA and the server's certificate, when TLS is on
"""

from __future__ import annotations

import base64
import datetime
import hashlib
import hmac
import ipaddress
import json
import os
import secrets
import ssl
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import nacl.exceptions
import nacl.signing
import nkeys

from couler.errors import NotFoundError, UserError
from couler_runtime.bus_access import (
    ADMIN,
    LAUNCHER_PREFIX,
    SERVICES,
    grant_for,
    launcher_identity,
    nats_permissions,
)
from couler_runtime.private_files import check_private, write_private

__all__ = [
    "HEADER_SIGNATURE",
    "HEADER_SIGNER",
    "SIGNED_HEADERS",
    "BusFiles",
    "BusIdentity",
    "SignatureError",
    "Trust",
    "new_seed",
    "public_key_of",
    "signing_input",
    "write_private",
]

HEADER_SIGNER = "couler-signer"
HEADER_SIGNATURE = "couler-signature"
# The headers a signature covers (lower case); others (traceparent, ...) are advisory.
SIGNED_HEADERS = ("nats-msg-id", "couler-event-id", "couler-event-type", "couler-source",
                  "couler-time", "couler-tenant", "couler-run-id", "couler-payload",
                  "couler-payload-size", HEADER_SIGNER)
_MSG_ID_CONTEXT = b"couler-msg-id\0"


class SignatureError(UserError):
    """A message is unsigned, signed by someone who does not own its subject, or forged."""


def new_seed() -> bytes:
    """A fresh nkey user seed (``SU...``)."""
    seed: bytes = nkeys.encode_seed(secrets.token_bytes(32), nkeys.PREFIX_BYTE_USER)
    return seed


def public_key_of(seed: bytes) -> str:
    """The public nkey (``U...``) of ``seed``; raises UserError on a malformed seed."""
    try:
        return bytes(nkeys.from_seed(bytearray(seed)).public_key).decode()
    except (nkeys.NkeysError, ValueError, TypeError) as exc:
        raise UserError(f"not an nkey seed: {type(exc).__name__}") from None


def _verify_key(public: str) -> nacl.signing.VerifyKey:
    """The Ed25519 key inside a public user nkey (base32: prefix, 32 bytes, crc16)."""
    try:
        raw = base64.b32decode(public + "=" * (-len(public) % 8))
    except (ValueError, TypeError):
        raise UserError(f"not a public nkey: {public[:8]!r}...") from None
    if len(raw) != 35 or raw[0] != nkeys.PREFIX_BYTE_USER:
        raise UserError(f"not a public user nkey: {public[:8]!r}...")
    crc = int.from_bytes(raw[33:], "little")
    if nkeys.crc16(bytearray(raw[:33])) != crc:
        raise UserError(f"public nkey {public[:8]!r}... fails its checksum")
    return nacl.signing.VerifyKey(raw[1:33])


def signing_input(subject: str, headers: Mapping[str, str], body_sha256: str) -> bytes:
    """The bytes a message's signature covers."""
    lower = {k.lower(): v for k, v in headers.items()}
    lines = [subject, *(f"{h}:{lower.get(h, '')}" for h in SIGNED_HEADERS), body_sha256]
    return "\n".join(lines).encode()


@dataclass(frozen=True)
class BusIdentity:
    """One identity's secret side: its name and its nkey seed (never logged).

    Attributes:
        name: The identity (a service's name, ``admin``, ``launch-<name>``).
        seed: The nkey seed (``SU...``).
    """

    name: str
    seed: bytes = field(repr=False)
    _signing_key: nacl.signing.SigningKey = field(init=False, repr=False, compare=False)
    _msg_id_secret: bytes = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        grant_for(self.name)  # KeyError for an unknown identity
        public_key_of(self.seed)  # UserError for a malformed seed
        # derived once: signing runs for every message published
        key = nkeys.from_seed(bytearray(self.seed))
        object.__setattr__(self, "_signing_key", key._keys)
        object.__setattr__(self, "_msg_id_secret",
                           hashlib.sha256(_MSG_ID_CONTEXT + self.seed).digest())

    @classmethod
    def from_file(cls, name: str, path: str | os.PathLike[str]) -> BusIdentity:
        """Read the seed of ``name`` from ``path`` (a file holding only the seed).

        Raises:
            UserError: The file is missing, unreadable, too open or not a seed.
        """
        p = Path(path)
        check_private(p, f"bus identity {name!r}: seed file")
        try:
            seed = p.read_bytes().strip()
        except OSError as exc:
            raise UserError(f"bus identity {name!r}: cannot read its seed file {p}: "
                            f"{exc.strerror or exc}") from None
        try:
            return cls(name, seed)
        except KeyError as exc:
            raise UserError(str(exc.args[0])) from None

    @property
    def public_key(self) -> str:
        """The public nkey (what the server's configuration and the trust file hold)."""
        return public_key_of(self.seed)

    @property
    def inbox_prefix(self) -> str:
        """Where this identity's replies arrive (its subscribe permission)."""
        from couler_runtime.bus_access import inbox_prefix

        return inbox_prefix(self.name)

    @property
    def signs(self) -> bool:
        """Whether this identity signs what it publishes (services and admin do)."""
        return grant_for(self.name).signs

    def sign(self, data: bytes) -> str:
        """The base64url Ed25519 signature of ``data``."""
        signature = self._signing_key.sign(data).signature
        return base64.urlsafe_b64encode(signature).decode().rstrip("=")

    def msg_id(self, subject: str, key: str) -> str:
        """``<key>.<tag>``: the same for the same (subject, key) from this identity,
        unguessable without its seed."""
        tag = hmac.new(self._msg_id_secret, f"{subject}\0{key}".encode(),
                       hashlib.sha256).hexdigest()
        return f"{key}.{tag[:20]}"


class Trust:
    """The public keys consumers verify signatures with, by identity."""

    def __init__(self, keys: Mapping[str, str]) -> None:
        self._public = dict(keys)
        self._keys = {name: _verify_key(pub) for name, pub in keys.items()}

    def __repr__(self) -> str:
        return f"Trust({', '.join(sorted(self._keys))})"

    @property
    def public_keys(self) -> Mapping[str, str]:
        """Identity -> public nkey."""
        return dict(self._public)

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Trust:
        """Read a trust file (``{"identities": {name: public nkey}}``).

        Raises:
            UserError: Missing or malformed, naming the file.
        """
        p = Path(path)
        try:
            data = json.loads(p.read_text())
            keys = data["identities"]
            if not isinstance(keys, dict) or not all(
                    isinstance(k, str) and isinstance(v, str) for k, v in keys.items()):
                raise TypeError("'identities' must map names to public keys")
            return cls(keys)
        except FileNotFoundError:
            raise UserError(f"bus trust file {p} does not exist") from None
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise UserError(f"bus trust file {p} is not valid: {type(exc).__name__}: "
                            f"{exc}") from None

    def verify(self, identity: str, data: bytes, signature: str) -> bool:
        """Whether ``signature`` over ``data`` was made by ``identity``'s key."""
        key = self._keys.get(identity)
        if key is None:
            return False
        try:
            raw = base64.urlsafe_b64decode(signature + "=" * (-len(signature) % 4))
            key.verify(data, raw)
        except (ValueError, TypeError, nacl.exceptions.BadSignatureError):
            return False
        return True


@dataclass(frozen=True)
class TlsFiles:
    """A CA and the server certificate it signed."""

    ca: Path
    cert: Path
    key: Path


class BusFiles:
    """The credential directory of one deployment (see the module docstring).

    Args:
        root: The directory (created 0700 by :meth:`create`).
    """

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)

    def __repr__(self) -> str:
        return f"BusFiles({str(self.root)!r})"

    @property
    def config(self) -> Path:
        """The server's configuration (``nats-server -c``)."""
        return self.root / "nats.conf"

    @property
    def trust_file(self) -> Path:
        """Identity -> public key, for consumers."""
        return self.root / "trust.json"

    @property
    def tls(self) -> TlsFiles | None:
        """The TLS files, when TLS is on."""
        files = TlsFiles(self.root / "tls" / "ca.pem", self.root / "tls" / "server.pem",
                         self.root / "tls" / "server-key.pem")
        return files if files.ca.is_file() else None

    def seed_file(self, identity: str) -> Path:
        """Where ``identity``'s seed is kept."""
        return self.root / "keys" / f"{identity}.nk"

    @classmethod
    def create(cls, root: str | os.PathLike[str], *, tls: bool = False,
               hosts: Iterable[str] = ("127.0.0.1", "localhost")) -> BusFiles:
        """Make (or complete) the directory: a seed for every service and ``admin``, the
        trust file and the server configuration; a CA and server certificate for
        ``hosts`` when ``tls``. Existing keys are kept, so a restart changes nothing."""
        files = cls(root)
        files.root.mkdir(parents=True, exist_ok=True, mode=0o700)
        files.root.chmod(0o700)
        for identity in (*SERVICES, ADMIN):
            if not files.seed_file(identity).is_file():
                write_private(files.seed_file(identity), new_seed() + b"\n")
        if tls and files.tls is None:
            _write_tls(files.root / "tls", tuple(hosts))
        files.refresh()
        return files

    def identity(self, name: str) -> BusIdentity:
        """The identity ``name`` read from its seed file."""
        return BusIdentity.from_file(name, self.seed_file(name))

    def public_keys(self) -> dict[str, str]:
        """Identity -> public key of every seed in ``keys/``."""
        keys: dict[str, str] = {}
        for path in sorted((self.root / "keys").glob("*.nk")):
            keys[path.stem] = public_key_of(path.read_bytes().strip())
        return keys

    def trust(self) -> Trust:
        """The trust file's keys."""
        return Trust.load(self.trust_file)

    def refresh(self) -> None:
        """Rewrite the trust file and the server configuration from the seeds on disk."""
        keys = self.public_keys()
        signing = {k: v for k, v in keys.items() if grant_for(k).signs}
        write_private(self.trust_file, json.dumps({"identities": signing}, indent=2) + "\n")
        write_private(self.config, server_config(keys, self.tls))

    def add_launcher(self, name: str) -> Path:
        """Create the launch-only identity ``launch-<name>``; the path of its seed.

        Raises:
            UserError: A bad name; ConflictError-like UserError when it exists.
        """
        try:
            identity = launcher_identity(name)
        except ValueError as exc:
            raise UserError(str(exc)) from None
        path = self.seed_file(identity)
        if path.exists():
            raise UserError(f"launcher {name!r} exists already ({path}); revoke it first")
        write_private(path, new_seed() + b"\n")
        self.refresh()
        return path

    def revoke_launcher(self, name: str) -> None:
        """Remove the launcher ``name``; the server refuses it after a reload."""
        path = self.seed_file(LAUNCHER_PREFIX + name)
        if not path.exists():
            raise NotFoundError(f"no launcher {name!r} (launchers: "
                                f"{', '.join(self.launchers()) or 'none'})")
        path.unlink()
        self.refresh()

    def launchers(self) -> list[str]:
        """The names of the launch-only identities."""
        return sorted(p.stem.removeprefix(LAUNCHER_PREFIX)
                      for p in (self.root / "keys").glob(f"{LAUNCHER_PREFIX}*.nk"))

    def env_lines(self) -> list[str]:
        """``COULER_NATS_SEED_<IDENTITY>=<seed>`` for every identity (a docker-compose
        ``.env``; docker-compose.yml hands each service its own)."""
        lines = []
        for path in sorted((self.root / "keys").glob("*.nk")):
            name = path.stem.upper().replace("-", "_")
            lines.append(f"COULER_NATS_SEED_{name}={path.read_text().strip()}")
        return lines

    def kubernetes_objects(self, namespace: str = "couler") -> list[dict[str, object]]:
        """The Secret ``couler-bus`` (``seed-<identity>``), the Secret ``couler-nats-config``
        (``nats.conf``, plus the TLS files when on) and the ConfigMap ``couler-bus-trust``
        (``trust.json``) that the manifests in ``deploy/k8s`` reference."""
        seeds = {f"seed-{p.stem}": p.read_text().strip()
                 for p in sorted((self.root / "keys").glob("*.nk"))}
        labels = {"app.kubernetes.io/part-of": "couler"}
        config = {"nats.conf": self.config.read_text()}
        files = self.tls
        if files is not None:
            # the server's configuration names them by absolute path: mount them beside it
            config["nats.conf"] = config["nats.conf"].replace(
                str(files.cert), "/etc/nats/server.pem").replace(
                str(files.key), "/etc/nats/server-key.pem")
            config["server.pem"] = files.cert.read_text()
            config["server-key.pem"] = files.key.read_text()
        return [
            {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
             "metadata": {"name": "couler-bus", "namespace": namespace, "labels": labels},
             "stringData": seeds},
            {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
             "metadata": {"name": "couler-nats-config", "namespace": namespace,
                          "labels": labels},
             "stringData": config},
            {"apiVersion": "v1", "kind": "ConfigMap",
             "metadata": {"name": "couler-bus-trust", "namespace": namespace,
                          "labels": labels},
             "data": {"trust.json": self.trust_file.read_text()}},
        ]

    def client_tls(self) -> ssl.SSLContext | None:
        """A client context trusting the deployment's CA, when TLS is on."""
        files = self.tls
        return None if files is None else ssl.create_default_context(cafile=str(files.ca))


def server_config(keys: Mapping[str, str], tls: TlsFiles | None) -> str:
    """The nats-server configuration: one nkey user per identity with its permissions
    (anonymous clients are refused), and TLS when given. NATS's configuration format
    reads JSON."""
    users = [{"nkey": public, "permissions": nats_permissions(grant_for(identity))}
             for identity, public in sorted(keys.items())]
    conf: dict[str, object] = {"authorization": {"users": users}}
    if tls is not None:
        conf["tls"] = {"cert_file": str(tls.cert), "key_file": str(tls.key), "timeout": 2}
    return json.dumps(conf, indent=2) + "\n"


def _write_tls(directory: Path, hosts: tuple[str, ...]) -> None:
    """A new CA and a server certificate for ``hosts`` (IP addresses or DNS names)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = datetime.datetime.now(datetime.UTC)

    def pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
        return key.private_bytes(serialization.Encoding.PEM,
                                 serialization.PrivateFormat.PKCS8,
                                 serialization.NoEncryption())

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "couler bus CA")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name)
          .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
          .not_valid_before(now - datetime.timedelta(hours=1))
          .not_valid_after(now + datetime.timedelta(days=825))
          .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
          .add_extension(x509.KeyUsage(False, False, False, False, False, True, True, False,
                                       False), critical=True)
          .sign(ca_key, hashes.SHA256()))
    names: list[x509.GeneralName] = []
    for host in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "couler nats")]))
            .issuer_name(ca_name).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(hours=1))
            .not_valid_after(now + datetime.timedelta(days=825))
            .add_extension(x509.SubjectAlternativeName(names), critical=False)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]),
                           critical=False)
            .sign(ca_key, hashes.SHA256()))
    write_private(directory / "ca-key.pem", pem_key(ca_key))
    write_private(directory / "server-key.pem", pem_key(key))
    write_private(directory / "server.pem", cert.public_bytes(serialization.Encoding.PEM))
    # the CA certificate is public; written last, so its presence means "TLS is complete"
    write_private(directory / "ca.pem", ca.public_bytes(serialization.Encoding.PEM))
