"""What the client says when something is wrong, without a tallyd: an
address given as a URL, a refused token in the client's own terms, a
plaintext client on a TLS port, gRPC's own log lines kept off stderr."""

import os
import subprocess
import sys
import textwrap
import unittest

import grpc

import tally
from tally._errors import PYTHON_TOKEN_HINT, TLS_MISMATCH_HINT, error_from_rpc


class AddressTest(unittest.TestCase):
    def test_a_url_is_named_with_the_address_to_give(self):
        with self.assertRaises(tally.ConfigError) as cm:
            tally.Client("http://tally.example.com:50051", environ={})
        message = str(cm.exception)
        self.assertIn('"http://tally.example.com:50051" is a URL', message)
        self.assertIn('without "http://" (give "tally.example.com:50051"', message)
        self.assertNotIn("IPv6", message)
        with self.assertRaises(tally.ConfigError) as cm:
            tally.Client(environ={"TALLY_CONTROLLER": "https://h:443/api"})
        self.assertIn('(give "h:443"; for TLS, set ca_cert)', str(cm.exception))


class ErrorWordsTest(unittest.TestCase):
    def test_unauthenticated_says_how_python_gives_a_token(self):
        e = error_from_rpc(grpc.StatusCode.UNAUTHENTICATED,
                           "unknown token; send `authorization: Bearer TOKEN` (tallyctl --token, "
                           "TALLY_TOKEN or a --context with a token_file)", "h:1")
        self.assertIsInstance(e, tally.Unauthenticated)
        self.assertNotIn("tallyctl", str(e))
        self.assertIn(PYTHON_TOKEN_HINT, str(e))
        self.assertIn("token=", str(e))
        self.assertIn("TALLY_TOKEN", str(e))
        self.assertIn("from_config", str(e))
        # A message without tallyctl's hint still gets the client's.
        e = error_from_rpc(grpc.StatusCode.UNAUTHENTICATED, "JWT refused: expired", "h:1")
        self.assertIn("JWT refused: expired; give a token: " + PYTHON_TOKEN_HINT, str(e))

    def test_a_plaintext_client_closed_by_a_tls_server_is_told_to_set_ca_cert(self):
        e = error_from_rpc(grpc.StatusCode.UNAVAILABLE, "Socket closed", "h:1", tls=False)
        self.assertIsInstance(e, tally.Unavailable)
        self.assertEqual(str(e), "tallyd at h:1: Socket closed (%s)" % TLS_MISMATCH_HINT)
        self.assertIn("the server speaks TLS: set ca_cert", str(e))
        # With TLS set, a closed socket is not about TLS.
        e = error_from_rpc(grpc.StatusCode.UNAVAILABLE, "Socket closed", "h:1", tls=True)
        self.assertEqual(str(e), "tallyd at h:1: Socket closed")
        e = error_from_rpc(grpc.StatusCode.UNAVAILABLE, "Tls handshake failed", "h:1", tls=True)
        self.assertIn("the TLS handshake failed: check ca_cert", str(e))


class GrpcLoggingTest(unittest.TestCase):
    SCRIPT = textwrap.dedent("""
        import os, sys
        import tally
        assert os.environ.get("GRPC_VERBOSITY") == os.environ.get("EXPECTED_VERBOSITY"), \
            "the environment was changed"
        import grpc
        from concurrent import futures
        server = grpc.server(futures.ThreadPoolExecutor(1))
        port = server.add_insecure_port("127.0.0.1:0")
        server.start()
        c = tally.Client("127.0.0.1:%d" % port, ca_cert=sys.argv[1], environ={}, retries=1,
                         timeout=3)
        try:
            c.get(1)
        except tally.Unavailable as e:
            print("refused:", e)
        """)

    def run_script(self, env):
        ca = "/etc/ssl/certs/ca-certificates.crt"  # any roots: the handshake fails first
        if not os.path.exists(ca):
            self.skipTest("no CA bundle at " + ca)
        return subprocess.run([sys.executable, "-c", self.SCRIPT, ca], capture_output=True,
                              text=True, env=env, timeout=60)

    def test_a_failed_handshake_is_in_the_exception_not_on_stderr(self):
        env = {k: v for k, v in os.environ.items() if not k.startswith("GRPC_")}
        r = self.run_script(env)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("refused:", r.stdout)
        self.assertIn("handshake", r.stdout.lower())
        self.assertNotIn("Handshake failed", r.stderr)
        self.assertEqual(r.stderr, "")
        # Asked for, gRPC's own lines come back.
        r = self.run_script(dict(env, GRPC_VERBOSITY="INFO", EXPECTED_VERBOSITY="INFO"))
        self.assertIn("Handshake failed", r.stderr)


if __name__ == "__main__":
    unittest.main()
