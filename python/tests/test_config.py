"""tally's connection settings and spec reading, without a tallyd: the rules
of cli/tallyctl/client_config.h and common/spec_yaml.h."""

import os
import tempfile
import unittest

import tally
from tally._config import is_loopback, parse_controller_list, resolve_connection

CA = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"


class ConfigTest(unittest.TestCase):
    def setUp(self):
        self.home = tempfile.mkdtemp(prefix="tally_cfg_")
        self.folder = os.path.join(self.home, ".config", "tally")
        os.makedirs(self.folder)
        self.write("ca.pem", CA)
        self.write("t.token", "  secret-token\n")
        self.write("config.yaml",
                   "current_context: a\n"
                   "contexts:\n"
                   "  - {name: a, address: 'h1:1,h2:2', ca_cert: ca.pem, token_file: t.token,\n"
                   "     tls_server_name: tally.test}\n"
                   "  - {name: b, address: 127.0.0.1:3}\n")

    def write(self, name, text):
        with open(os.path.join(self.folder, name), "w") as f:
            f.write(text)

    def env(self, **more):
        return dict({"HOME": self.home}, **more)

    def test_the_current_context_with_paths_beside_the_file(self):
        c = resolve_connection(env=self.env())
        self.assertEqual(c.context, "a")
        self.assertEqual(c.addresses, ("h1:1", "h2:2"))
        self.assertEqual(c.ca_cert_path, os.path.join(self.folder, "ca.pem"))
        self.assertEqual(c.token, "secret-token")
        self.assertEqual(c.tls_server_name, "tally.test")
        self.assertNotIn("secret-token", repr(c))

    def test_arguments_beat_the_environment_which_beats_the_context(self):
        c = resolve_connection(env=self.env(TALLY_CONTROLLER="e:1", TALLY_TOKEN="env-token"))
        self.assertEqual((c.address, c.token, c.token_source), ("e:1", "env-token", "TALLY_TOKEN"))
        c = resolve_connection("f:1", token="arg", env=self.env(TALLY_CONTROLLER="e:1"))
        self.assertEqual((c.address, c.token, c.address_source), ("f:1", "arg", "controller"))
        c = resolve_connection(env=self.env(TALLY_CONTEXT="b"))
        self.assertEqual((c.address, c.token, c.tls), ("127.0.0.1:3", "", False))

    def test_defaults_and_a_missing_file(self):
        c = resolve_connection(env={"HOME": tempfile.mkdtemp()})
        self.assertEqual((c.address, c.context, c.config_file), ("127.0.0.1:50051", "", ""))
        with self.assertRaisesRegex(tally.ConfigError, "TALLY_CONFIG"):
            resolve_connection(env={"TALLY_CONFIG": "/nonexistent.yaml"})
        with self.assertRaisesRegex(tally.ConfigError, "no config file"):
            resolve_connection(env={"HOME": tempfile.mkdtemp(), "TALLY_CONTEXT": "x"})

    def test_bad_files_name_the_field(self):
        self.write("config.yaml", "contexts:\n  - {name: a, adress: h:1}\n")
        with self.assertRaisesRegex(tally.ConfigError, r"contexts\[0\]: unknown field \"adress\""):
            resolve_connection(env=self.env())
        self.write("config.yaml", "contexts:\n  - {name: a, address: h:1, tls_server_name: x}\n")
        with self.assertRaisesRegex(tally.ConfigError, "tls_server_name: set without ca_cert"):
            resolve_connection(env=self.env())
        self.write("config.yaml", "current_context: z\ncontexts:\n  - {name: a, address: h:1}\n")
        with self.assertRaisesRegex(tally.ConfigError, "known: a"):
            resolve_connection(env=self.env())

    def test_address_lists_and_tokens(self):
        self.assertEqual(parse_controller_list(" a:1 , [::1]:2,dns:///b:3", "x"),
                         ("a:1", "[::1]:2", "dns:///b:3"))
        for bad, why in (("a:1,a:1", "given twice"), ("a", "no port"), ("a:0", "port"),
                         ("a:1,", "is empty")):
            with self.assertRaisesRegex(tally.ConfigError, why):
                parse_controller_list(bad, "controller")
        with self.assertRaisesRegex(tally.ConfigError, "both set"):
            resolve_connection(token="a", token_file="b", env={})
        with self.assertRaisesRegex(tally.ConfigError, "at byte 2"):
            resolve_connection(token="a\tb", env={})
        self.assertTrue(is_loopback("127.0.0.2:1") and is_loopback("[::1]:1"))
        self.assertFalse(is_loopback("10.0.0.1:1"))


class SpecTest(unittest.TestCase):
    def test_dicts_and_files_read_as_tallyctl_reads_them(self):
        s = tally.load_job_spec({"data": {"packing": "PAD_TO_SEQ_LEN"}, "optimizer": {"lr": "3e-3"},
                                 "model": {"numLayers": 2}, "labels": {"team": "x"}})
        self.assertEqual((s.data.packing, s.optimizer.lr, s.model.num_layers, s.labels["team"]),
                         (2, 0.003, 2, "x"))
        path = os.path.join(tempfile.mkdtemp(), "exp.yaml")
        with open(path, "w") as f:
            f.write("base: {optimizer: {lr: 1e-3}}\nvariants:\n  - {name: a, overrides: "
                    "{data: {packing: packed}}}\ntarget: {val_loss: 2.5}\nstrategy: all\n")
        e = tally.load_experiment_spec(path)
        self.assertEqual((e.base.optimizer.lr, e.variants[0].overrides["data"]["packing"],
                          e.target.val_loss, e.strategy), (0.001, "packed", 2.5, 1))
        for bad, field in (({"model": {"layers": 1}}, "spec.model.layers"),
                           ({"data": {"packing": "tight"}}, "spec.data.packing"),
                           ({"training": {"max_steps": "many"}}, "spec.training.max_steps"),
                           ({"labels": ["a"]}, "spec.labels")):
            with self.assertRaises(tally.InvalidSpec) as cm:
                tally.load_job_spec(bad)
            self.assertEqual(cm.exception.field, field)


if __name__ == "__main__":
    unittest.main()
