"""Sample suite for the unittest log parser: docstrings, output between name and result, every status."""
import unittest


class SampleTests(unittest.TestCase):
    def test_ok(self):
        self.assertTrue(True)

    def test_docstring(self):
        """First line of a docstring is printed by -v."""
        self.assertEqual(1, 1)

    def test_fail(self):
        self.assertEqual(1, 2)

    def test_error(self):
        raise RuntimeError("boom")

    @unittest.skip("not here")
    def test_skip(self):
        pass

    @unittest.expectedFailure
    def test_expected_failure(self):
        self.assertEqual(1, 2)

    def test_prints(self):
        import sys
        sys.stderr.write("noise written by the test\n")
        self.assertTrue(True)


class BrokenSetupClass(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        raise RuntimeError("class setup broke")

    def test_never(self):
        pass
