"""The worker pipe: every message reads back as what was sent, and what is not a message is refused
by name, by the codec and by the real worker host."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from fuselens.contracts.config import InputSpec, ModelSettings
from fuselens.contracts.options import AnalyzeOptions, ValidateOptions
from fuselens.contracts.plain import ContractError, to_plain
from fuselens.worker.protocol import (
    AnalyzeJob,
    Cancel,
    CompareJob,
    Done,
    Failed,
    Failure,
    Limits,
    PingJob,
    Preload,
    Progress,
    Ready,
    Run,
    Shutdown,
    ValidateJob,
    decode_event,
    decode_request,
    encode,
)

OPTIONS = AnalyzeOptions(
    input_shapes=["2,64"],
    dtypes=["int64"],
    source_text="class Net: ...\n",
    models={"Net": ModelSettings(inputs=[InputSpec([2, 64], "int64")], init={"dim": 64}, param_dtype="bfloat16")},
)


@pytest.mark.parametrize(
    "message",
    [
        Run(1, AnalyzeJob("/m.py", OPTIONS), Limits(30.0, 2048)),
        Run(2, ValidateJob("/m.py", OPTIONS, ValidateOptions(interpret=True, clusters=["c0"]))),
        Run(3, CompareJob("/m.py", AnalyzeOptions())),
        Run(4, PingJob()),
        Cancel(1),
        Shutdown(),
        Preload(["transformers.models.llama.modeling_llama"]),
    ],
    ids=lambda m: type(m).__name__ + ("." + m.job.kind if isinstance(m, Run) else ""),
)
def test_requests_read_back_as_they_were_sent(message):
    assert decode_request(encode(message)) == message


@pytest.mark.parametrize(
    "message",
    [
        Ready(123, "3.11.7", "2.13.0", 900),
        Progress(7, "validating", 0.5),
        Done(7, {"pong": True}),
        Failed(7, Failure("timeout", "the analysis did not finish", "/m.py", 12)),
    ],
    ids=lambda m: type(m).__name__,
)
def test_events_read_back_as_they_were_sent(message):
    assert decode_event(encode(message)) == message


def _run_line(**options) -> bytes:
    data = to_plain(Run(9, AnalyzeJob("/m.py", AnalyzeOptions())))
    data["job"]["options"].update(options)
    return (json.dumps(data) + "\n").encode()


@pytest.mark.parametrize(
    "line, message",
    [
        (_run_line(input_shape=["2,64"]), "request.job.options: unknown field 'input_shape'"),
        (_run_line(branch_paths="4"), "request.job.options.branch_paths: expected int, got a string"),
        (b'{"op": "run", "id": 9, "job": {"kind": "analyse", "path": "/m.py"}}', "kind 'analyse' is not one of"),
        (b'{"op": "reboot"}', "op 'reboot' is not one of"),
        (b"not json\n", "not a JSON message"),
    ],
    ids=["unknown option", "wrong type", "unknown job", "unknown op", "not JSON"],
)
def test_a_malformed_request_is_refused_by_name(line, message):
    with pytest.raises(ContractError, match=re.escape(message)):
        decode_request(line)


def test_the_worker_answers_a_request_it_cannot_read_with_a_failure(tmp_path):
    """A job with an option the worker does not know fails at once, naming it; the worker keeps serving."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    host = subprocess.Popen(
        [sys.executable, "-m", "fuselens.worker.host"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        cwd=tmp_path,
        env=env,
    )
    try:
        assert isinstance(decode_event(host.stdout.readline()), Ready)
        host.stdin.write(_run_line(input_shape=["2,64"]))
        host.stdin.write(encode(Run(10, PingJob())))
        host.stdin.flush()
        events = {}
        while len(events) < 2:
            event = decode_event(host.stdout.readline())
            if isinstance(event, (Done, Failed)):
                events[event.id] = event
        refused, answered = events[9], events[10]
        assert isinstance(refused, Failed) and refused.error.kind == "internal"
        assert "unknown field 'input_shape'" in refused.error.message
        assert isinstance(answered, Done) and answered.result == {"pong": True}
        host.stdin.write(encode(Shutdown()))
        host.stdin.close()
        assert host.wait(timeout=60) == 0
    finally:
        if host.poll() is None:
            host.kill()
