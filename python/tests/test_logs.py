"""tally._logs without a tallyd: the selector of logs()'s arguments, the
LogLine object and the escaping of untrusted text."""

import datetime
import unittest

import tally
from tally import _logs
from tally.v1 import jobs_pb2


class SelectorTest(unittest.TestCase):

    def test_arguments_become_the_selector(self):
        sel = _logs.selector(attempt=2, rank=0, tail=100, after=7)
        self.assertEqual(sel.attempt, 2)
        self.assertTrue(sel.HasField("rank"))
        self.assertEqual(sel.rank, 0)
        self.assertEqual(sel.tail, 100)
        self.assertEqual(sel.after_sequence, 7)
        self.assertFalse(_logs.selector().HasField("rank"))
        self.assertFalse(_logs.selector().HasField("since"))

    def test_since_is_a_timedelta_ago_or_a_datetime(self):
        before = datetime.datetime.now(datetime.timezone.utc) - datetime.timedelta(minutes=10)
        sel = _logs.selector(since=datetime.timedelta(minutes=10))
        at = sel.since.ToDatetime(tzinfo=datetime.timezone.utc)
        self.assertLess(abs((at - before).total_seconds()), 5)
        fixed = datetime.datetime(2026, 1, 2, 3, 4, 5, tzinfo=datetime.timezone.utc)
        self.assertEqual(_logs.selector(since=fixed).since.ToDatetime(
            tzinfo=datetime.timezone.utc), fixed)

    def test_wrong_arguments_are_refused_naming_them(self):
        with self.assertRaisesRegex(ValueError, "tail"):
            _logs.selector(tail=-1)
        with self.assertRaisesRegex(TypeError, "attempt"):
            _logs.selector(attempt="1")  # type: ignore[arg-type]
        with self.assertRaisesRegex(ValueError, "rank"):
            _logs.selector(rank=-1)
        with self.assertRaisesRegex(TypeError, "since"):
            _logs.selector(since=600)  # type: ignore[arg-type]


class LogLineTest(unittest.TestCase):

    def line(self, text, source="trainer"):
        m = jobs_pb2.LogLine(sequence=4, attempt=1, rank=0, level="warning", source=source,
                             text=text)
        m.time.FromDatetime(datetime.datetime(2026, 12, 6, 13, 40, 1, 123000))
        return tally.LogLine.from_proto(m)

    def test_fields_and_str(self):
        line = self.line("step 10 loss 2.5")
        self.assertEqual(line.sequence, 4)
        self.assertEqual(line.time.tzinfo, datetime.timezone.utc)
        self.assertEqual(str(line), "2026-12-06 13:40:01.123 a1 r0 warning step 10 loss 2.5")
        self.assertIn("[worker] ", str(self.line("x", source="worker")))

    def test_control_characters_are_escaped(self):
        shown = str(self.line("\x1b[2J\x07\r\tok\u202e\x9b"))
        self.assertIn("\\x1b[2J\\x07\\r\\tok\\u{202E}\\u{009B}", shown)
        self.assertFalse(any(ord(c) < 0x20 or 0x7f <= ord(c) <= 0x9f for c in shown))


if __name__ == "__main__":
    unittest.main()
