"""The pytest plugin as a user gets it: test files run by an inner pytest (pytester) with only
the plugin, no project conftest: fixtures, markers, options, fakes, faults, records. Imports
nothing of tests/, so it also runs in a virtualenv with only the testing extra
(tests/unit/test_testing_extra_venv.py copies it there, ``TRITON_MOCK_EXAMPLE`` naming the
example repository)."""

from __future__ import annotations

import os
import shutil
import textwrap
from pathlib import Path

import pytest

PLUGIN = ("-p", "orchestrator.testing.pytest_plugin", "-p", "no:cacheprovider")
EXAMPLE = Path(os.environ.get("TRITON_MOCK_EXAMPLE")
               or Path(__file__).resolve().parents[2] / "examples" / "test-your-python-models")

ECHO_CONFIG = '''
name: "echo"
backend: "python"
max_batch_size: 4
input [ { name: "IN" data_type: TYPE_FP32 dims: [ 2 ] } ]
output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 2 ] } ]
'''
ECHO_PY = '''
import json
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        self.logger = pb_utils.Logger
        # the family must outlive its metrics, as in Triton
        self.family = pb_utils.MetricFamily("echo_requests", "requests seen", pb_utils.MetricFamily.COUNTER)
        self.counter = self.family.Metric({"m": "echo"})

    def execute(self, requests):
        out = []
        for r in requests:
            self.logger.log_info("echo got a request")
            self.counter.increment(1)
            x = pb_utils.get_input_tensor_by_name(r, "IN").as_numpy()
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", x * 2)]))
        return out
'''


def run(pytester: pytest.Pytester, source: str, *args: str) -> pytest.RunResult:
    pytester.makepyfile(test_user=textwrap.dedent(source))
    return pytester.runpytest_inprocess(*PLUGIN, *args)


def test_an_empty_repository_filled_in_the_test_with_logs_metrics_calls_and_delays(pytester):
    result = run(pytester, f'''
        import time
        import numpy as np
        import pytest
        from orchestrator.testing.mock import InferError, LoadError

        CONFIG = {ECHO_CONFIG!r}
        MODEL = {ECHO_PY!r}

        def test_echo(triton_mock):
            assert triton_mock.repository_index() == []
            triton_mock.add_model("echo", CONFIG, MODEL)
            out = triton_mock.infer("echo", {{"IN": np.ones((3, 2), np.float32)}})
            assert out["OUT"].tolist() == [[2, 2]] * 3
            assert triton_mock.calls_to("echo") == [(3,)]
            assert [r.message for r in triton_mock.logs if r.model == "echo"] == ["echo got a request"]
            assert triton_mock.metric("echo_requests", {{"m": "echo"}}) == 1
            triton_mock.set_delay("echo", 0.05)
            start = time.monotonic()
            triton_mock.infer("echo", {{"IN": np.ones((1, 2), np.float32)}})
            assert time.monotonic() - start >= 0.05
            with pytest.raises(InferError, match="unexpected shape for input 'IN'"):
                triton_mock.infer("echo", {{"IN": np.ones((1, 3), np.float32)}})
            triton_mock.unload("echo")
            assert not triton_mock.is_model_ready("echo")
            with pytest.raises(LoadError):
                triton_mock.add_model("broken", "name: 'broken' backend: 'python' max_batch_size: nope")
    ''')
    result.assert_outcomes(passed=1)


def test_the_repository_marker_loads_the_users_models_and_fakes_never_touch_the_directory(pytester):
    shutil.copytree(EXAMPLE / "model_repository", pytester.path / "model_repository")
    before = sorted(str(p.relative_to(pytester.path)) for p in (pytester.path / "model_repository").rglob("*"))
    result = run(pytester, '''
        import numpy as np
        import pytest

        @pytest.mark.triton_repository("model_repository", load=["pipeline", "embedder", "classifier"])
        def test_real_then_fake(triton_mock):
            assert triton_mock.is_model_ready("embedder")
            text = {"TEXT": np.array([b"x"], dtype=object)}
            assert triton_mock.infer("pipeline", text)["LABEL"].shape == (1,)
            triton_mock.fake("classifier", lambda x: {"LOGITS": np.float32([[9, 0, 0]])},
                             inputs={"EMBEDDING": ("FP32", [-1, 8])}, outputs={"LOGITS": ("FP32", [-1, 3])})
            assert triton_mock.infer("pipeline", text)["LABEL"].tolist() == [b"negative"]

        @pytest.mark.triton_repository("model_repository")
        def test_nothing_loaded_without_load(triton_mock):
            assert not triton_mock.is_model_ready("pipeline")
            assert {m["name"] for m in triton_mock.repository_index()} == {"pipeline", "embedder", "classifier"}
    ''')
    result.assert_outcomes(passed=2)
    after = sorted(str(p.relative_to(pytester.path)) for p in (pytester.path / "model_repository").rglob("*"))
    assert after == before


def test_the_repository_option_and_ini(pytester):
    shutil.copytree(EXAMPLE / "model_repository", pytester.path / "repo")
    source = '''
        def test_it(triton_mock):
            assert {m["name"] for m in triton_mock.repository_index()} == {"pipeline", "embedder", "classifier"}
    '''
    run(pytester, source, "--triton-repository", "repo").assert_outcomes(passed=1)
    pytester.makeini("[pytest]\ntriton_repository = repo\n")
    run(pytester, source).assert_outcomes(passed=1)


def test_the_release_marker_and_option_pick_the_pb_utils_features(pytester):
    model = '''
import triton_python_backend_utils as pb_utils
class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUT", pb_utils.get_input_tensor_by_name(r, "IN").as_numpy())],
                                           parameters={"seen": True}) for r in requests]
'''
    result = run(pytester, f'''
        import numpy as np
        import pytest
        from orchestrator.testing.mock import InferError

        CONFIG = {ECHO_CONFIG!r}
        MODEL = {model!r}

        def test_default_is_24_10(triton_mock):
            assert triton_mock.release == "24.10"
            triton_mock.add_model("echo", CONFIG, MODEL)
            with pytest.raises(InferError, match="TypeError"):
                triton_mock.infer("echo", {{"IN": np.ones((1, 2), np.float32)}})

        @pytest.mark.triton_release("26.08")
        def test_26_08_has_response_parameters(triton_mock):
            triton_mock.add_model("echo", CONFIG, MODEL)
            out, parameters = triton_mock.infer_response("echo", {{"IN": np.ones((1, 2), np.float32)}})
            assert parameters == {{"seen": True}}

        def test_factory_release_argument(triton_mock_factory):
            assert triton_mock_factory(release="2.51").release == "24.10"
            assert triton_mock_factory(release="26.08").release == "26.08"
    ''')
    result.assert_outcomes(passed=3)
    run(pytester, '''
        def test_it(triton_mock):
            assert triton_mock.release == "26.08"
    ''', "--triton-release", "26.08").assert_outcomes(passed=1)


def test_fakes_as_function_with_parameters_generator_and_class(pytester):
    result = run(pytester, '''
        import numpy as np
        import pytest
        import triton_python_backend_utils as pb_utils
        from orchestrator.testing.mock import InferError

        CALLER = """
        import triton_python_backend_utils as pb_utils
        class TritonPythonModel:
            def execute(self, requests):
                out = []
                for r in requests:
                    x = pb_utils.get_input_tensor_by_name(r, "X")
                    resp = pb_utils.InferenceRequest(model_name="down", inputs=[x], requested_output_names=["Y"],
                                                     parameters={"scale": 3}).exec()
                    if resp.has_error():
                        out.append(pb_utils.InferenceResponse(error=resp.error()))
                    else:
                        out.append(pb_utils.InferenceResponse([pb_utils.Tensor("Y", pb_utils.get_output_tensor_by_name(resp, "Y").as_numpy())]))
                return out
        """
        CALLER_CONFIG = """
        name: "caller" backend: "python" max_batch_size: 0
        input [ { name: "X" data_type: TYPE_INT64 dims: [ -1 ] } ]
        output [ { name: "Y" data_type: TYPE_INT64 dims: [ -1 ] } ]
        """

        def test_function_with_parameters_and_its_errors(triton_mock):
            def down(inputs, parameters):
                if inputs["X"].sum() < 0:
                    raise ValueError("negative input")
                return {"Y": inputs["X"] * parameters["scale"]}
            triton_mock.fake("down", down, inputs={"X": "INT64"}, outputs={"Y": "INT64"})
            triton_mock.add_model("caller", CALLER_CONFIG, CALLER)
            assert triton_mock.infer("caller", {"X": np.array([1, 2])})["Y"].tolist() == [3, 6]
            with pytest.raises(InferError, match="negative input"):
                triton_mock.infer("caller", {"X": np.array([-5])})
            assert triton_mock.calls_to("down") == [(1,), (1,)]

        def test_generator_is_a_decoupled_fake(triton_mock):
            def tokens(inputs):
                for i in range(int(inputs["N"][0])):
                    yield {"TOKEN": np.array([i], np.int32)}
            triton_mock.fake("stream", tokens, inputs={"N": "INT32"}, outputs={"TOKEN": "INT32"})
            responses = triton_mock.infer_stream("stream", {"N": np.array([3], np.int32)})
            assert [r.outputs["TOKEN"].tolist() for r in responses if r.outputs] == [[0], [1], [2]]
            assert responses[-1].final

        def test_class_is_the_model_itself(triton_mock):
            class Down:
                def execute(self, requests):
                    return [pb_utils.InferenceResponse(error=pb_utils.TritonError("class says no")) for _ in requests]
            triton_mock.fake("down", Down, inputs={"X": "INT64"}, outputs={"Y": "INT64"})
            triton_mock.add_model("caller", CALLER_CONFIG, CALLER)
            with pytest.raises(InferError, match="class says no"):
                triton_mock.infer("caller", {"X": np.array([1])})
    ''')
    result.assert_outcomes(passed=3)


def test_a_failing_test_shows_the_mock_log(pytester):
    result = run(pytester, f'''
        import numpy as np
        CONFIG = {ECHO_CONFIG!r}
        MODEL = {ECHO_PY!r}

        def test_fails(triton_mock):
            triton_mock.add_model("echo", CONFIG, MODEL)
            triton_mock.infer("echo", {{"IN": np.ones((1, 2), np.float32)}})
            assert False
    ''')
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*triton mock log*", "INFO [[]echo[]] echo got a request"])


def test_a_fake_needs_its_outputs(pytester):
    result = run(pytester, '''
        import pytest
        def test_it(triton_mock):
            with pytest.raises(ValueError, match="declare its outputs"):
                triton_mock.fake("down", lambda x: {}, inputs={"X": "INT64"})
            with pytest.raises(ValueError, match="unknown datatype"):
                triton_mock.fake("down", lambda x: {}, inputs={"X": "COMPLEX"}, outputs={"Y": "INT64"})
    ''')
    result.assert_outcomes(passed=1)
