"""TLS: a self-signed ECDSA P-256 certificate minted on the spot, or the PEMs you bring.

    cert, key, minted = self_signed(directory, ["localhost", "127.0.0.1", "192.168.1.20"])
    ctx = context(cert, key)                   # for tornado's HTTPServer(ssl_options=ctx)
    fingerprint(cert)                          # "SHA256 AB:CD:…" to compare with the browser's

Browsers allow the microphone only in a secure context, and a LAN box has no public name to get
a real certificate for, so `--tls` mints one. It is kept in `directory` (default
~/.cache/nwhisper/tls) and reused while it still covers the names and is not about to expire:
the browser's "accept the risk" exception is tied to the certificate, so it is asked once, not
at every restart. The key file is written 0600.

The certificate is its own issuer and carries what a strict verifier (Python ≥ 3.13's
VERIFY_X509_STRICT, browsers) wants of a leaf: subjectAltName with every name and address,
serverAuth, digitalSignature, basicConstraints CA:FALSE, subject and authority key ids. A client
that trusts this one file (`verify=cert`, `--cacert cert`) verifies the server normally.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import socket
import ssl

VALID_DAYS = 365
RENEW_DAYS = 7       # mint anew when the kept certificate expires sooner than this


def default_dir():
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "nwhisper", "tls")


def names_for(host):
    """The names a certificate for a server bound to `host` should cover."""
    names = ["localhost", "127.0.0.1", "::1", socket.gethostname()]
    if host not in ("", "0.0.0.0", "::"):
        names.append(host.strip("[]"))
    else:       # every address: add this machine's own, as far as the resolver knows them
        try:
            names += socket.gethostbyname_ex(socket.gethostname())[2]
        except OSError:
            pass
    return list(dict.fromkeys(n for n in names if n))


def _san(names):
    from cryptography import x509

    out = []
    for n in names:
        try:
            out.append(x509.IPAddress(ipaddress.ip_address(n)))
        except ValueError:
            out.append(x509.DNSName(n))
    return out


def _covers(cert_path, names):
    from cryptography import x509

    try:
        with open(cert_path, "rb") as f:
            cert = x509.load_pem_x509_certificate(f.read())
        have = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except (OSError, ValueError, x509.ExtensionNotFound):
        return False
    left = cert.not_valid_after_utc - datetime.datetime.now(datetime.timezone.utc)
    return left > datetime.timedelta(days=RENEW_DAYS) and set(_san(names)) <= set(have)


def self_signed(directory, names):
    """(cert path, key path, minted?) — the kept certificate if it covers `names`, else a new one."""
    cert_path, key_path = os.path.join(directory, "cert.pem"), os.path.join(directory, "key.pem")
    if os.path.exists(key_path) and _covers(cert_path, names):
        return cert_path, key_path, False
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"nwhisper on {names[0]}"),
                      x509.NameAttribute(NameOID.ORGANIZATION_NAME, "nwhisper self-signed")])
    now = datetime.datetime.now(datetime.timezone.utc)
    ski = x509.SubjectKeyIdentifier.from_public_key(key.public_key())
    cert = (x509.CertificateBuilder()
            .subject_name(name).issuer_name(name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))   # clocks disagree a little
            .not_valid_after(now + datetime.timedelta(days=VALID_DAYS))
            .add_extension(x509.SubjectAlternativeName(_san(names)), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, content_commitment=False,
                                         key_encipherment=False, data_encipherment=False,
                                         key_agreement=False, key_cert_sign=False, crl_sign=False,
                                         encipher_only=False, decipher_only=False), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .add_extension(ski, critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ski),
                           critical=False)
            .sign(key, hashes.SHA256()))
    os.makedirs(directory, mode=0o700, exist_ok=True)
    fd = os.open(key_path + ".tmp", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                  serialization.NoEncryption()))
    with open(cert_path + ".tmp", "wb") as f:
        f.write(cert.public_bytes(serialization.Encoding.PEM))
    os.replace(key_path + ".tmp", key_path)
    os.replace(cert_path + ".tmp", cert_path)
    return cert_path, key_path, True


def context(cert_path, key_path):
    """A server SSLContext; a bad or mismatched PEM raises ValueError naming the files."""
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    try:
        ctx.load_cert_chain(cert_path, key_path)
    except (ssl.SSLError, OSError) as e:
        raise ValueError(f"cannot use certificate {cert_path} with key {key_path}: {e}") from None
    return ctx


def fingerprint(cert_path):
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes

    with open(cert_path, "rb") as f:
        cert = x509.load_pem_x509_certificate(f.read())
    return "SHA256 " + cert.fingerprint(hashes.SHA256()).hex(":").upper()
