"""A command whose reader goes away (`mofa … | head`) stops quietly with the SIGPIPE status, not an
"internal error"."""

import subprocess
import sys

from mofa_framework.cli import SIGPIPE_STATUS


def test_a_closed_pipe_stops_the_command_quietly():
    proc = subprocess.Popen([sys.executable, "-m", "mofa_framework", "list-models", "--format", "csv"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.close()  # the reader leaves before the first line is written
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == SIGPIPE_STATUS, err
    assert "internal error" not in err and "Traceback" not in err and "Exception ignored" not in err, err
