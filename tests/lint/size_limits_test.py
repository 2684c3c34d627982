"""size_limits.py's function finder on sources written to a temporary tree."""
import os
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import size_limits  # noqa: E402


def body(n):
    return "".join(f"  x += {i};\n" for i in range(n))


class FunctionsTest(unittest.TestCase):
    def functions_of(self, text):
        with tempfile.NamedTemporaryFile("w", suffix=".cc", delete=False) as f:
            f.write(text)
        try:
            return {name: length for length, name, _ in size_limits.functions(f.name)}
        finally:
            os.unlink(f.name)

    def test_counts_a_function_from_its_brace_to_its_end(self):
        found = self.functions_of("namespace a {\nint F(int x) {\n" + body(3) + "  return x;\n}\n}\n")
        self.assertEqual(found, {"F": 6})

    def test_braces_in_comments_strings_and_raw_strings_do_not_count(self):
        text = ('int G() {\n  // } not a close\n  const char* s = "}}{";\n'
                '  const char* r = R"x(\n}\n)x";\n  /* { */\n  return 0;\n}\n')
        self.assertEqual(self.functions_of(text), {"G": 9})

    def test_lambdas_and_local_classes_belong_to_the_function_around_them(self):
        text = ("void H() {\n  auto f = [](int a) {\n    return a;\n  };\n"
                "  struct Local { int v; };\n}\n")
        self.assertEqual(self.functions_of(text), {"H": 6})

    def test_macros_continued_over_lines_are_not_code(self):
        text = ("#define CHECK()  \\\n  do {            \\\n    if (y) {      \\\n"
                "      x();        \\\n    }             \\\n"
                "  } while (0)\nint K() {\n  return 0;\n}\n")
        self.assertEqual(self.functions_of(text), {"K": 3})

    def test_classes_and_initialisers_are_not_functions(self):
        text = ("class C {\n public:\n  int M() const { return 1; }\n};\n"
                "const int kTable[] = {1, 2, 3};\n")
        self.assertEqual(self.functions_of(text), {"M": 1})

    def test_a_tree_over_the_limits_fails_naming_the_place(self):
        with tempfile.TemporaryDirectory() as root:
            os.makedirs(os.path.join(root, "server"))
            with open(os.path.join(root, "server", "long.cc"), "w") as f:
                f.write("int Long(int x) {\n" + body(120) + "  return x;\n}\n")
            with open(os.path.join(root, "server", "long_test.cc"), "w") as f:
                f.write("int Test(int x) {\n" + body(300) + "  return x;\n}\n")
            run = subprocess.run([sys.executable, os.path.join(HERE, "size_limits.py"), root],
                                 capture_output=True, text=True)
            self.assertEqual(run.returncode, 1, run.stdout)
            self.assertIn("server/long.cc:1: Long is 123 lines", run.stdout)
            self.assertNotIn("long_test.cc", run.stdout)  # tests are not production


if __name__ == "__main__":
    unittest.main()
