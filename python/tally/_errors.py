"""Exceptions by meaning. Each carries tallyd's own message (``message``),
the gRPC status code (``code``) and the address that answered (``address``)."""

from __future__ import annotations

import re

import grpc

__all__ = [
    "TallyError", "ConfigError", "InvalidSpec", "NotFound", "AlreadyExists", "PermissionDenied",
    "Unauthenticated", "FailedPrecondition", "ResourceExhausted", "Unavailable",
    "DeadlineExceeded", "error_from_rpc",
]


class TallyError(Exception):
    """Base of every error this package raises.

    Attributes:
        message: What tallyd (or the client) said, never containing the token.
        code: The gRPC status code, or None for an error found locally.
        address: The tallyd address that gave the answer, when one did.
    """

    def __init__(self, message: str, code: grpc.StatusCode | None = None,
                 address: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        self.address = address

    def __str__(self) -> str:
        return self.message


class ConfigError(TallyError, ValueError):
    """The connection settings (arguments, environment, config file, token
    or CA file) are wrong; the message names the setting and how to fix it,
    as tallyctl's do."""


class InvalidSpec(TallyError, ValueError):
    """A spec or request tallyd (or the local reader) refused:
    INVALID_ARGUMENT. ``field`` is the field path the message starts with
    (e.g. ``spec.model.num_heads``), or "" when it names none."""

    def __init__(self, message: str, code: grpc.StatusCode | None = None,
                 address: str = "", field: str = "") -> None:
        super().__init__(message, code, address)
        self.field = field or field_of(message)


class NotFound(TallyError, LookupError):
    """NOT_FOUND: no such job or experiment (another tenant's reads so too)."""


class AlreadyExists(TallyError):
    """ALREADY_EXISTS."""


class PermissionDenied(TallyError):
    """PERMISSION_DENIED: the token's role or tenant does not allow the call."""


class Unauthenticated(TallyError):
    """UNAUTHENTICATED: tallyd did not accept the token (or none was sent)."""


class FailedPrecondition(TallyError):
    """FAILED_PRECONDITION: e.g. cancelling a job that has ended."""


class ResourceExhausted(TallyError):
    """RESOURCE_EXHAUSTED: a quota or a limit on streams."""


class Unavailable(TallyError, ConnectionError):
    """UNAVAILABLE after every address and every retry (or a failed TLS
    handshake)."""


class DeadlineExceeded(Unavailable, TimeoutError):
    """DEADLINE_EXCEEDED: no answer within the call's deadline."""


# "spec.model.num_heads: ...", "job.yaml: spec.x (line 3): ...",
# "variants[2] (packed-moe): spec.model.moe.top_k: ...".
_FIELD = re.compile(r"([A-Za-z_][A-Za-z0-9_]*(?:\[\d+\])?(?:\.[A-Za-z_][A-Za-z0-9_]*(?:\[\d+\])?)*)"
                    r"(?: \(line \d+\))?: ")


def field_of(message: str) -> str:
    """The field path a validation message names first, or "" for none."""
    for m in _FIELD.finditer(message):
        path = m.group(1)
        if "." in path or "[" in path or path in ("spec", "name", "request_id", "page_size",
                                                  "page_token", "states", "tenant", "labels",
                                                  "display_name_prefix", "created_after",
                                                  "created_before"):
            return path
    return ""


_BY_CODE: dict[grpc.StatusCode, type[TallyError]] = {
    grpc.StatusCode.INVALID_ARGUMENT: InvalidSpec,
    grpc.StatusCode.NOT_FOUND: NotFound,
    grpc.StatusCode.ALREADY_EXISTS: AlreadyExists,
    grpc.StatusCode.PERMISSION_DENIED: PermissionDenied,
    grpc.StatusCode.UNAUTHENTICATED: Unauthenticated,
    grpc.StatusCode.FAILED_PRECONDITION: FailedPrecondition,
    grpc.StatusCode.RESOURCE_EXHAUSTED: ResourceExhausted,
    grpc.StatusCode.UNAVAILABLE: Unavailable,
    grpc.StatusCode.DEADLINE_EXCEEDED: DeadlineExceeded,
}


# tallyd words its token hint for tallyctl; a Python user sets the token
# another way.
_TALLYCTL_TOKEN_HINT = "(tallyctl --token, TALLY_TOKEN or a --context with a token_file)"
PYTHON_TOKEN_HINT = ("(tally.Client(token=...) or token_file=..., the TALLY_TOKEN environment "
                     "variable, or a context with a token_file: tally.Client.from_config(\"NAME\"))")
TLS_MISMATCH_HINT = ("the server speaks TLS: set ca_cert (tally.Client(ca_cert=\"ca.pem\"), "
                     "TALLY_CA_CERT or the context's ca_cert)")
_TLS_WORDS = ("ssl", "tls", "handshake", "certificate")


def error_from_rpc(code: grpc.StatusCode, details: str | None, address: str,
                   token: str = "", tls: bool = True) -> TallyError:
    """The exception for a failed call: its class by ``code``, tallyd's
    message (with the token blanked out, should it appear), with what to do
    in this client's terms: how to give a token, and that a plaintext client
    (``tls`` False) whose connection the server closed should set ca_cert."""
    message = details or "tallyd answered %s with no message" % code.name
    if token:
        message = message.replace(token, "<token>")
    if code == grpc.StatusCode.UNAUTHENTICATED:
        if _TALLYCTL_TOKEN_HINT in message:
            message = message.replace(_TALLYCTL_TOKEN_HINT, PYTHON_TOKEN_HINT)
        else:
            message += "; give a token: " + PYTHON_TOKEN_HINT
    if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
        lower = message.lower()
        if not tls and ("socket closed" in lower or "connection reset" in lower):
            message += " (%s)" % TLS_MISMATCH_HINT  # what a TLS server does to plaintext
        elif tls and any(w in lower for w in _TLS_WORDS):
            message += (" (the TLS handshake failed: check ca_cert and tls_server_name, or "
                        "whether tallyd serves TLS at this address)")
        message = "tallyd at %s: %s" % (address, message)
    return _BY_CODE.get(code, TallyError)(message, code, address)
