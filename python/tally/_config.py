"""How the client reaches tallyd, resolved by tallyctl's rules
(cli/tallyctl/client_config.h): each setting from the first that has it, an
argument, an environment variable, the chosen context of the config file,
the built-in default.

=================  =====================  ==================  ================
setting            argument               environment         context
=================  =====================  ==================  ================
address(es)        controller             TALLY_CONTROLLER    address
TLS roots          ca_cert                TALLY_CA_CERT       ca_cert
certificate name   tls_server_name        -                   tls_server_name
token              token, token_file      TALLY_TOKEN         token_file
context            context                TALLY_CONTEXT       (current_context)
config file        config_file            TALLY_CONFIG        (~/.config/tally/config.yaml)
=================  =====================  ==================  ================

The address defaults to 127.0.0.1:50051 and may list several tallyds
separated by commas (a leader and its standbys). Without roots the channel is
plaintext; without a token no authorization header is sent. A token may be
any bearer credential tallyd accepts: one of its tokens or a signed JWT. A
missing config file is no error unless it was named (config_file,
TALLY_CONFIG) or a context was (context, TALLY_CONTEXT). A leading "~" is
$HOME; a relative path in the config file is relative to the file's folder.
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Mapping
from typing import Any

import yaml

from tally._errors import ConfigError

__all__ = ["Connection", "resolve_connection", "parse_controller_list", "DEFAULT_CONTROLLER"]

DEFAULT_CONTROLLER = "127.0.0.1:50051"
MAX_CONFIG_BYTES = 64 << 10
MAX_TOKEN_BYTES = 4096
MAX_CA_CERT_BYTES = 1 << 20
_CONTEXT_FIELDS = ("name", "address", "ca_cert", "token_file", "tls_server_name")
_FORM = "give HOST:PORT[,HOST:PORT...], e.g. tally-0.tally:50051,tally-1.tally:50051"
_SCHEMES = ("dns:", "ipv4:", "ipv6:", "unix:", "unix-abstract:")


@dataclasses.dataclass(frozen=True)
class Connection:
    """How to reach tallyd, resolved. ``token`` is never printed: the
    dataclass's repr leaves it out.

    Attributes:
        addresses: Every tallyd address, in the order calls try them.
        address_source: Where they came from ("controller", "TALLY_CONTROLLER",
            'context "prod" of FILE'; "" for the default).
        ca_cert_path: The TLS roots' file; "" means a plaintext channel.
        ca_cert_pem: Its PEM bytes.
        ca_cert_source: Where the roots came from.
        tls_server_name: The name checked in tallyd's certificate ("": the
            address's host).
        token: The bearer token ("" for none).
        token_source: Where the token came from ("TALLY_TOKEN", "token_file /x").
        context: The chosen context's name, "" for none.
        config_file: The config file read, "" when none was.
    """

    addresses: tuple[str, ...]
    address_source: str = ""
    ca_cert_path: str = ""
    ca_cert_pem: bytes = dataclasses.field(default=b"", repr=False)
    ca_cert_source: str = ""
    tls_server_name: str = ""
    token: str = dataclasses.field(default="", repr=False)
    token_source: str = ""
    context: str = ""
    config_file: str = ""

    @property
    def address(self) -> str:
        """The addresses as tallyctl's --controller takes them: "a:1,b:2"."""
        return ",".join(self.addresses)

    @property
    def tls(self) -> bool:
        """Whether calls use TLS."""
        return bool(self.ca_cert_pem)


def _quoted(s: str) -> str:
    return '"%s"' % s.encode("unicode_escape").decode("ascii")


def _printable_word(s: str) -> bool:
    return bool(s) and all(0x20 < ord(c) < 0x7F for c in s)


def _get(env: Mapping[str, str], name: str) -> str | None:
    v = env.get(name)
    return v if v else None


def expand_home(path: str, env: Mapping[str, str]) -> str:
    """``path`` with a leading "~" or "~/" replaced by $HOME."""
    if not path.startswith("~"):
        return path
    if len(path) > 1 and path[1] != "/":
        raise ConfigError("%s: only ~ and ~/ are expanded (to $HOME), not ~user; write the full "
                          "path" % _quoted(path))
    home = _get(env, "HOME")
    if home is None:
        raise ConfigError("%s: HOME is not set, so ~ means nothing; write the full path"
                          % _quoted(path))
    return home.rstrip("/") + path[1:] if home != "/" else path[1:] or "/"


def _read_small(path: str, max_bytes: int, what: str) -> bytes:
    """The file's bytes; FileNotFoundError when it does not exist."""
    where = "%s %s" % (what, path)
    try:
        with open(path, "rb") as f:
            data = f.read(max_bytes + 1)
    except FileNotFoundError:
        raise
    except OSError as e:
        raise ConfigError("%s: cannot read: %s" % (where, e.strerror or e)) from None
    if len(data) > max_bytes:
        raise ConfigError("%s: larger than %d bytes; is this the right file?"
                          % (where, max_bytes))
    return data


def check_token(token: str, source: str) -> None:
    """Raises ConfigError unless ``token`` can be sent as a bearer token:
    1 to 4096 printable ASCII characters without spaces."""
    if not token:
        raise ConfigError("%s: the token is empty; give the token tallyctl token create made"
                          % source)
    if len(token.encode()) > MAX_TOKEN_BYTES:
        raise ConfigError("%s: the token is %d bytes, over the limit of %d; is this the right "
                          "file?" % (source, len(token.encode()), MAX_TOKEN_BYTES))
    for i, c in enumerate(token):
        if not 0x20 < ord(c) < 0x7F:
            raise ConfigError("%s: the token has a space, control or non-ASCII character at byte "
                              "%d of %d; a token is printable ASCII without spaces (one per file)"
                              % (source, i + 1, len(token)))


def is_loopback(address: str) -> bool:
    """Whether the host of "host:port" is loopback, where a token may travel
    without TLS."""
    host = address
    for prefix in ("dns:///", "ipv4:", "ipv6:"):
        if host.startswith(prefix):
            host = host[len(prefix):]
    if host.startswith("["):
        close = host.find("]")
        if close < 0:
            return False
        host = host[1:close]
    elif ":" in host:
        host = host[:host.rfind(":")]
    if host.lower() == "localhost" or host == "::1":
        return True
    parts = host.split(".")
    return (len(parts) == 4 and parts[0] == "127"
            and all(p.isdigit() and 0 <= int(p) <= 255 for p in parts))


def _host_port_problem(address: str) -> str:
    scheme_end = address.find("://")
    if scheme_end >= 0:  # "http://host:port" is a web address; gRPC takes none
        rest = address[scheme_end + 3:].split("/", 1)[0]
        return ('is a URL: tallyd is reached at HOST:PORT without "%s" (give "%s"; for TLS, '
                'set ca_cert)' % (address[:scheme_end + 3], rest))
    if address.startswith("["):
        close = address.find("]")
        if close < 0:
            return "has '[' without ']'"
        host, rest = address[1:close], address[close + 1:]
        if not rest.startswith(":"):
            return "has no port after the IPv6 host"
        port = rest[1:]
        if not host or not all(c in "0123456789abcdefABCDEF:.%" for c in host):
            return "has a bad IPv6 host"
    else:
        colon = address.rfind(":")
        if colon < 0:
            return "has no port"
        host, port = address[:colon], address[colon + 1:]
        if not host:
            return "has no host"
        if ":" in host:
            return "has an IPv6 host that is not in brackets ([::1]:50051)"
        if not re.fullmatch(r"[A-Za-z0-9._-]+", host):
            return "has a host with characters other than letters, digits, '-', '.' and '_'"
    if (not port or not port.isascii() or not port.isdigit() or len(port) > 5
            or not 1 <= int(port) <= 65535):
        return 'has port "%s"; a port is a number from 1 to 65535' % port
    return ""


def parse_controller_list(value: str, source: str) -> tuple[str, ...]:
    """Splits an address list at commas and checks each address as tallyctl
    does (common/controller_list.h): HOST:PORT, [IPv6]:PORT or a gRPC target
    with its scheme; no empty address, none given twice."""
    if not value.strip():
        raise ConfigError("%s: no address; %s" % (source, _FORM))
    parts = value.split(",")
    out: list[str] = []
    for i, part in enumerate(parts):
        address = part.strip()
        where = source if len(parts) == 1 else "%s: address %d of %d" % (source, i + 1, len(parts))
        if not address:
            raise ConfigError("%s is empty (%s); %s" % (where, _quoted(value), _FORM))
        quoted = _quoted(address)
        if not _printable_word(address):
            raise ConfigError("%s: %s has blanks or unprintable characters; %s"
                              % (where, quoted, _FORM))
        scheme = next((s for s in _SCHEMES if address.startswith(s)), None)
        if scheme is not None:
            if len(address) == len(scheme):
                raise ConfigError("%s: %s names no address after its scheme; %s"
                                  % (where, quoted, _FORM))
        else:
            problem = _host_port_problem(address)
            if problem:
                raise ConfigError("%s: %s %s; %s" % (where, quoted, problem, _FORM))
        if address in out:
            raise ConfigError("%s: %s is given twice; list each tallyd once" % (where, quoted))
        out.append(address)
    return tuple(out)


class _StrictLoader(yaml.SafeLoader):
    """YAML without anchors or aliases and without a key given twice."""

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()  # type: ignore[no-untyped-call]
            raise yaml.constructor.ConstructorError(
                None, None, "aliases are not allowed", event.start_mark)
        event = self.peek_event()  # type: ignore[no-untyped-call]
        if getattr(event, "anchor", None):
            raise yaml.constructor.ConstructorError(
                None, None, "anchors are not allowed", event.start_mark)
        return super().compose_node(parent, index)

    def construct_mapping(self, node: Any, deep: bool = False) -> Any:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, "the key %r is given twice" % (key,), key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def parse_client_config(text: bytes, source: str) -> dict[str, Any]:
    """Parses tallyctl's config file strictly (unknown fields, wrong types,
    keys given twice, anchors refused) and checks each context; returns
    {"current_context": str, "contexts": [dict, ...]}."""
    if len(text) > MAX_CONFIG_BYTES:
        raise ConfigError("%s: larger than %d bytes; is this the right file?"
                          % (source, MAX_CONFIG_BYTES))
    shape = (" (the file holds current_context and a list of contexts, each with name, address "
             "and optionally ca_cert, token_file, tls_server_name)")
    try:
        doc = yaml.load(text.decode("utf-8"), Loader=_StrictLoader)
    except (yaml.YAMLError, UnicodeDecodeError) as e:
        raise ConfigError("%s: %s%s" % (source, str(e).replace("\n", " "), shape)) from None
    if doc is None:
        doc = {}
    if not isinstance(doc, dict):
        raise ConfigError("%s: the file is not a mapping%s" % (source, shape))
    for key in doc:
        if key not in ("current_context", "contexts"):
            raise ConfigError("%s: unknown field %s; Config has: current_context, contexts"
                              % (source, _quoted(str(key))))
    current = doc.get("current_context") or ""
    if not isinstance(current, str):
        raise ConfigError("%s: current_context: must be a string%s" % (source, shape))
    contexts = doc.get("contexts") or []
    if not isinstance(contexts, list):
        raise ConfigError("%s: contexts: must be a list%s" % (source, shape))
    names: list[str] = []
    for i, c in enumerate(contexts):
        path = "%s: contexts[%d]" % (source, i)
        if not isinstance(c, dict):
            raise ConfigError("%s: must be a mapping%s" % (path, shape))
        for key, value in c.items():
            if key not in _CONTEXT_FIELDS:
                raise ConfigError("%s: unknown field %s; Context has: %s"
                                  % (path, _quoted(str(key)), ", ".join(_CONTEXT_FIELDS)))
            if value is not None and not isinstance(value, str):
                raise ConfigError("%s.%s: must be a string" % (path, key))
        name = c.get("name") or ""
        if not name:
            raise ConfigError("%s: name is required; give each context a name" % path)
        if not _printable_word(name):
            raise ConfigError("%s.name: %s has a space or an unprintable character; use a plain "
                              "word" % (path, _quoted(name)))
        if name in names:
            raise ConfigError("%s.name: %s is also the name of contexts[%d]; context names must "
                              "be unique, rename or remove one" % (path, _quoted(name),
                                                                   names.index(name)))
        names.append(name)
        named = "%s (%s)" % (path, _quoted(name))
        address = c.get("address") or ""
        if not address:
            raise ConfigError("%s: address is required; give tallyd's host:port, e.g. "
                              "tally.example.com:50051" % named)
        if not _printable_word(address):
            raise ConfigError("%s.address: %s has a space or an unprintable character; give "
                              "host:port" % (named, _quoted(address)))
        server_name = c.get("tls_server_name") or ""
        if server_name and not c.get("ca_cert"):
            raise ConfigError("%s.tls_server_name: set without ca_cert; the name is checked only "
                              "over TLS, so add ca_cert or remove tls_server_name" % named)
        if server_name and not _printable_word(server_name):
            raise ConfigError("%s.tls_server_name: %s has a space or an unprintable character"
                              % (named, _quoted(server_name)))
    return {"current_context": current,
            "contexts": [{k: (v or "") for k, v in c.items()} for c in contexts]}


def _config_path(path: str, config_file: str, env: Mapping[str, str]) -> str:
    expanded = expand_home(path, env)
    if expanded.startswith("/"):
        return expanded
    slash = config_file.rfind("/")
    return (config_file[:slash + 1] if slash >= 0 else "") + expanded


def _check_pem(pem: bytes, where: str) -> None:
    fix = ("; give the CA certificate(s) that signed tallyd's certificate, in PEM "
           "(-----BEGIN CERTIFICATE-----)")
    if b"-----BEGIN CERTIFICATE-----" not in pem:
        raise ConfigError("%s: no PEM certificate in it%s" % (where, fix))
    if pem.count(b"-----BEGIN CERTIFICATE-----") != pem.count(b"-----END CERTIFICATE-----"):
        raise ConfigError("%s: a PEM certificate in it does not parse%s" % (where, fix))


def resolve_connection(controller: str | None = None, *, token: str | None = None,
                       token_file: str | None = None, ca_cert: str | None = None,
                       tls_server_name: str | None = None, context: str | None = None,
                       config_file: str | None = None,
                       env: Mapping[str, str] | None = None) -> Connection:
    """Resolves the connection as tallyctl does from its flags of the same
    names, the environment (``env``, default os.environ, which also gives
    HOME) and the config file, reading the files it names. Raises
    ConfigError naming the setting at fault."""
    env = os.environ if env is None else env
    config_path = ""
    config_named_by = ""
    if config_file:
        config_path, config_named_by = config_file, "config_file"
    elif _get(env, "TALLY_CONFIG"):
        config_path, config_named_by = env["TALLY_CONFIG"], "TALLY_CONFIG"
    elif _get(env, "HOME"):
        config_path = "~/.config/tally/config.yaml"
    context_name = ""
    context_named_by = ""
    if context:
        context_name, context_named_by = context, "context"
    elif _get(env, "TALLY_CONTEXT"):
        context_name, context_named_by = env["TALLY_CONTEXT"], "TALLY_CONTEXT"

    config: dict[str, Any] = {"current_context": "", "contexts": []}
    have_config = False
    used_config = ""
    if config_path:
        try:
            config_path = expand_home(config_path, env)
        except ConfigError as e:
            raise ConfigError("%s %s" % (config_named_by, e.message)) from None
        try:
            text = _read_small(config_path, MAX_CONFIG_BYTES, config_named_by or "config file")
        except FileNotFoundError:
            if config_named_by:
                raise ConfigError("%s %s: cannot read: No such file or directory; write the file "
                                  "or unset %s" % (config_named_by, config_path,
                                                   config_named_by)) from None
            if context_named_by:
                raise ConfigError("%s %s: there is no config file at %s to define it; write one, "
                                  "or point config_file or TALLY_CONFIG at it"
                                  % (context_named_by, _quoted(context_name),
                                     config_path)) from None
        else:
            config = parse_client_config(text, config_path)
            have_config = True
            used_config = config_path
    elif context_named_by:
        raise ConfigError("%s %s: HOME is not set, so there is no default config file; give "
                          "config_file or TALLY_CONFIG" % (context_named_by, _quoted(context_name)))

    if not context_named_by and have_config and config["current_context"]:
        context_name, context_named_by = config["current_context"], "current_context"
    ctx: dict[str, str] | None = None
    if context_name:
        for c in config["contexts"]:
            if c["name"] == context_name:
                ctx = c
        if ctx is None:
            names = [c["name"] for c in config["contexts"]]
            known = "known: " + ", ".join(names) if names else "the file has none"
            raise ConfigError("%s: %s %s names no context in the file (%s); %s"
                              % (config_path, context_named_by, _quoted(context_name), known,
                                 "fix current_context, or choose one with context"
                                 if context_named_by == "current_context"
                                 else "choose one of those"))
    in_context = ('context %s of %s' % (_quoted(ctx["name"]), config_path)) if ctx else ""

    if controller:
        address, address_source = controller, "controller"
    elif _get(env, "TALLY_CONTROLLER"):
        address, address_source = env["TALLY_CONTROLLER"], "TALLY_CONTROLLER"
    elif ctx is not None:
        address, address_source = ctx["address"], in_context
    else:
        address, address_source = DEFAULT_CONTROLLER, ""
    if not _printable_word(address):
        raise ConfigError("%s: the address %s has a space or an unprintable character; give "
                          "host:port" % (address_source, _quoted(address)))

    ca_path = ""
    ca_source = ""
    if ca_cert:
        ca_path, ca_source = ca_cert, "ca_cert"
    elif _get(env, "TALLY_CA_CERT"):
        ca_path, ca_source = env["TALLY_CA_CERT"], "TALLY_CA_CERT"
    elif ctx is not None and ctx.get("ca_cert"):
        ca_source = in_context + ", ca_cert"
        try:
            ca_path = _config_path(ctx["ca_cert"], config_path, env)
        except ConfigError as e:
            raise ConfigError("%s: %s" % (ca_source, e.message)) from None
    pem = b""
    if ca_path:
        try:
            ca_path = expand_home(ca_path, env)
        except ConfigError as e:
            raise ConfigError("%s: %s" % (ca_source, e.message)) from None
        try:
            pem = _read_small(ca_path, MAX_CA_CERT_BYTES, ca_source)
        except FileNotFoundError:
            raise ConfigError("%s %s: cannot read: No such file or directory; give the CA "
                              "certificate file (PEM)" % (ca_source, ca_path)) from None
        _check_pem(pem, "%s %s" % (ca_source, ca_path))

    server_name = ""
    if tls_server_name:
        if not _printable_word(tls_server_name):
            raise ConfigError("tls_server_name %s has a space or an unprintable character"
                              % _quoted(tls_server_name))
        if not pem:
            raise ConfigError("tls_server_name is set without TLS roots; the name is checked "
                              "only over TLS, so also give ca_cert (or TALLY_CA_CERT, or a "
                              "context with ca_cert)")
        server_name = tls_server_name
    elif ctx is not None and pem:
        server_name = ctx.get("tls_server_name", "")

    if token and token_file:
        raise ConfigError("token and token_file are both set; give one")
    the_token = ""
    token_source = ""
    token_path = ""
    if token:
        the_token, token_source = token, "token"
    elif token_file:
        token_path, token_source = token_file, "token_file"
    elif _get(env, "TALLY_TOKEN"):
        the_token, token_source = env["TALLY_TOKEN"], "TALLY_TOKEN"
    elif ctx is not None and ctx.get("token_file"):
        token_source = in_context + ", token_file"
        try:
            token_path = _config_path(ctx["token_file"], config_path, env)
        except ConfigError as e:
            raise ConfigError("%s: %s" % (token_source, e.message)) from None
    if token_path:
        try:
            token_path = expand_home(token_path, env)
        except ConfigError as e:
            raise ConfigError("%s: %s" % (token_source, e.message)) from None
        try:
            data = _read_small(token_path, MAX_TOKEN_BYTES + 64, token_source)
        except FileNotFoundError:
            raise ConfigError("%s %s: cannot read: No such file or directory; give the file "
                              "holding the token (tallyctl token create prints one)"
                              % (token_source, token_path)) from None
        token_source = "%s %s" % (token_source, token_path)
        the_token = data.decode("utf-8", "replace").strip(" \t\n\v\f\r")
    if token_source:
        check_token(the_token, token_source)

    addresses = parse_controller_list(address, address_source)
    return Connection(addresses=addresses, address_source=address_source, ca_cert_path=ca_path,
                      ca_cert_pem=pem, ca_cert_source=ca_source, tls_server_name=server_name,
                      token=the_token, token_source=token_source,
                      context=ctx["name"] if ctx else "", config_file=used_config)
