#!/usr/bin/python3
# Runs ONE file of rdma-core's vendored test suite (rdma-core-v44-tests/tests/test_*.py) the way
# its own tests/run_tests.py does (the `tests` package loaded from its __init__.py, which imports
# every test module; args_parser takes --dev/--port/--gid; unittest runs the rest), with
# unittest's verbose output, plus one machine-readable line per test on stdout, printed as soon
# as the test ends (so a crash of the interpreter still leaves the results before it):
#
#   @@RESULT {"test": "tests.test_pd.PDTest.test_alloc_pd", "outcome": "ok", "reason": ""}
#
# outcome is ok, skip, fail, error, xfail (expected failure) or xpass (unexpected success);
# reason is the skip reason or the failure's exception line (the traceback's last line).
#
#   usage: run_file.py test_pd [--dev rocectl_veth-a] [--gid 1] [-v]
#
# Called by conformance/tests/pyverbs_suite.rs with Debian's /usr/bin/python3 (python3-pyverbs)
# and LD_LIBRARY_PATH pointing at rocectl's drop-in libibverbs.so.1.
import json
import os
import sys
import traceback
import unittest
from importlib.machinery import SourceFileLoader

HERE = os.path.dirname(os.path.abspath(__file__))
TESTS = os.path.join(HERE, "rdma-core-v44-tests", "tests")


def emit(test, outcome, reason=""):
    line = json.dumps({"test": test.id(), "outcome": outcome, "reason": reason})
    sys.stdout.write("@@RESULT " + line + "\n")
    sys.stdout.flush()


def exception_line(err):
    """The last line of the formatted exception: 'pyverbs...Error: Failed to ...'."""
    lines = traceback.format_exception_only(err[0], err[1])
    text = "".join(lines).strip().splitlines()
    return text[-1] if text else repr(err[1])


class StreamingResult(unittest.TextTestResult):
    def addSuccess(self, test):
        super().addSuccess(test)
        emit(test, "ok")

    def addSkip(self, test, reason):
        super().addSkip(test, reason)
        emit(test, "skip", str(reason))

    def addFailure(self, test, err):
        super().addFailure(test, err)
        emit(test, "fail", exception_line(err))

    def addError(self, test, err):
        super().addError(test, err)
        emit(test, "error", exception_line(err))

    def addExpectedFailure(self, test, err):
        super().addExpectedFailure(test, err)
        emit(test, "xfail", exception_line(err))

    def addUnexpectedSuccess(self, test):
        super().addUnexpectedSuccess(test)
        emit(test, "xpass")

    def addSubTest(self, test, subtest, err):
        super().addSubTest(test, subtest, err)
        if err is not None:
            outcome = "fail" if issubclass(err[0], test.failureException) else "error"
            emit(subtest, outcome, exception_line(err))


def main():
    if len(sys.argv) < 2 or not sys.argv[1].startswith("test_"):
        sys.stderr.write("usage: run_file.py test_<name> [--dev DEV] [--gid N] [-v]\n")
        return 2
    module = sys.argv.pop(1)
    # As tests/run_tests.py: its directory first on the path (args_parser), the package loaded
    # from __init__.py under the name 'tests' (the modules import tests.base, tests.utils).
    sys.path.insert(0, TESTS)
    from args_parser import parser

    tests = SourceFileLoader("tests", os.path.join(TESTS, "__init__.py")).load_module()
    parser.parse_args()
    suite = unittest.defaultTestLoader.loadTestsFromName(module, tests)
    runner = unittest.TextTestRunner(
        stream=sys.stderr, verbosity=2, resultclass=StreamingResult
    )
    result = runner.run(suite)
    return 0 if result.wasSuccessful() else 1


if __name__ == "__main__":
    sys.exit(main())
