"""The endpoint following a symlink (``STATE_DIR/current``): requests sent without pause
over real HTTP while the link is switched from model A to model B, then to a delta of
A, all succeed, and their answers move from A's probabilities to B's to the delta's; a
damaged model the link is then switched to is refused in one line and the delta keeps
serving."""

import http.client
import os
import shutil
import signal
import socket
import threading
import time

import numpy as np
import pytest
import torch

from common.atomic import atomic_symlink
from serving import export, predict, serve
from tests.serving.test_serve import address
from tests.support.exported_model import tiny_checkpoint


def shift(seed: int):
    def change(model: torch.nn.Module) -> None:
        generator = torch.Generator().manual_seed(seed)
        for tensor in model.parameters():
            tensor.data += 0.3 * torch.randn(tensor.shape, generator=generator)

    return change


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, str]:
    """Exports of three steps of a tiny model: A and B in full, C as a delta of A; and a
    copy of B with a damaged model file."""
    root = tmp_path_factory.mktemp("reload")
    paths = {name: str(root / name) for name in ("a", "b", "c", "bad")}
    export.export_model(tiny_checkpoint(root, "reload", step=1), paths["a"], [])
    export.export_model(tiny_checkpoint(root, "reload", step=2, change=shift(1)), paths["b"], [])
    export.export_model(tiny_checkpoint(root, "reload", step=3, change=shift(2)), paths["c"], [], delta_from=paths["a"])
    shutil.copytree(paths["b"], paths["bad"])
    with open(os.path.join(paths["bad"], "fp32.pt2"), "r+b") as f:
        f.seek(-200, os.SEEK_END)
        f.write(b"\xff" * 8)
    return {**paths, "root": str(root)}


def raw_lines(count: int) -> bytes:
    rng = np.random.default_rng(1)
    return b"".join(
        "\t".join(
            ["0", *map(str, rng.integers(0, 100, 13)), *(f"{h:08x}" for h in rng.integers(0, 2**32, 26))]
        ).encode()
        + b"\n"
        for _ in range(count)
    )


def test_requests_all_succeed_while_the_link_switches_models(models):
    body = raw_lines(16)
    expected = {name: predict.Predictor(models[name]).predict_lines(body) for name in ("a", "b", "c")}
    assert min(np.abs(expected[x] - expected[y]).max() for x, y in ("ab", "bc", "ca")) > 1e-3

    def model_of(text: str) -> int | None:
        """Which model's probabilities an answer holds (forwards batched with other
        requests' rows may differ in the last digits), or None."""
        answer = np.array(text.split(), dtype=np.float64)
        names = [n for n in "abc" if answer.shape == expected[n].shape and np.abs(answer - expected[n]).max() < 1e-5]
        return "abc".index(names[0]) if names else None

    link = os.path.join(models["root"], "current")
    atomic_symlink(link, models["a"])
    log: list[str] = []
    answers: list[tuple[int, int, str]] = []  # client, status, body
    stop = threading.Event()

    errors: list[Exception] = []

    def client(number: int) -> None:
        connection = http.client.HTTPConnection(*address(url), timeout=60)
        try:
            while not stop.is_set():
                connection.request("POST", "/predict", body=body)
                response = connection.getresponse()
                answers.append((number, response.status, response.read().decode()))
        except Exception as e:  # a dropped request: the test fails on it below
            errors.append(e)
        finally:
            connection.close()

    def wait_for(condition, what: str) -> None:
        deadline = time.monotonic() + 60
        while not condition():
            assert time.monotonic() < deadline, f"no {what} within 60 s; log: {log}"
            time.sleep(0.02)

    def answered(name: str) -> bool:
        return any(model_of(text) == "abc".index(name) for _, _, text in answers[-4:])

    load = serve.Predictor
    with serve.serving_in_background(load(os.path.realpath(link)), max_batch_delay_ms=1) as (url, batcher):
        watcher = serve.ModelWatcher(link, batcher, load, interval_s=0.05, log=log.append)
        watcher.start()
        clients = [threading.Thread(target=client, args=(number,)) for number in range(2)]
        for thread in clients:
            thread.start()
        try:
            wait_for(lambda: len(answers) >= 10, "answers")
            atomic_symlink(link, models["b"])
            wait_for(lambda: answered("b"), "answer of model B")
            atomic_symlink(link, models["c"])  # a delta: applied onto A, which it names
            wait_for(lambda: answered("c"), "answer of the delta")
            atomic_symlink(link, models["bad"])
            wait_for(lambda: len(log) == 3, "refusal")
            seen = len(answers)
            wait_for(lambda: len(answers) >= seen + 10, "answers after the refusal")
        finally:
            stop.set()
            for thread in clients:
                thread.join()
            watcher.close()
    assert errors == [] and {status for _, status, _ in answers} == {200}
    for number in range(2):  # each client's answers: A's, then B's, then the delta's
        models_answering = [model_of(text) for client, _, text in answers if client == number]
        assert None not in models_answering and models_answering == sorted(models_answering)  # type: ignore[type-var]
        assert models_answering[0] == 0 and models_answering[-1] == 2
    assert {model_of(text) for _, _, text in answers} == {0, 1, 2}
    assert log[:2] == [
        f"reloaded {link}: now serving {models['b']} (step 2)",
        f"reloaded {link}: now serving {models['c']} (step 3)",
    ]
    assert log[2].startswith(f"reload refused: {link} -> {models['bad']}: {models['bad']}/fp32.pt2")
    assert log[2].endswith(f"; still serving {models['c']}") and len(log) == 3
    assert watcher.reloads == 2


def test_a_model_of_other_inputs_is_not_swapped_in(models, tmp_path):
    other = str(tmp_path / "other")
    export.export_model(tiny_checkpoint(tmp_path, "other", num_embeddings=12), other, [])
    link = str(tmp_path / "current")
    atomic_symlink(link, models["a"])
    log: list[str] = []
    batcher = serve.BatchingPredictor(serve.Predictor(models["a"]))
    try:
        watcher = serve.ModelWatcher(link, batcher, serve.Predictor, interval_s=1, log=log.append)
        atomic_symlink(link, other)
        assert not watcher.check() and not watcher.check()  # refused once, not tried again
        assert log == [
            f"reload refused: {link} -> {other}: its inputs differ from the model in service "
            f"(num_embeddings_per_feature): restart the server to serve it; still serving {models['a']}"
        ]
        atomic_symlink(link, models["b"])
        assert watcher.check() and batcher.predictor.inputs.step == 2
    finally:
        batcher.close()


def test_a_negative_reload_interval_is_refused(models, capsys):
    assert serve.main(["--model", models["a"], "--reload_interval_s", "-1", "--port", "0"]) == 2
    assert capsys.readouterr().err.strip().endswith("--reload_interval_s must not be negative, got -1.0")


def test_the_server_follows_its_symlink(models, tmp_path, capsys):
    """``python -m serving.serve --model LINK`` (its main, in this process: a signal
    stops it as it stops the command): it follows the link, says so, its answers change
    when the link is switched, and its summary line comes on SIGTERM."""
    link = str(tmp_path / "current")
    atomic_symlink(link, models["a"])
    body = raw_lines(3)
    expected = {name: predict.Predictor(models[name]).predict_lines(body) for name in "ab"}
    with socket.socket() as s:  # a free port, for the server to listen on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    answers: list[np.ndarray] = []
    errors: list[BaseException] = []

    def client() -> None:
        try:
            for name in "ab":
                deadline = time.monotonic() + 60
                while not answers or np.abs(answers[-1] - expected[name]).max() > 1e-6:
                    assert time.monotonic() < deadline, f"no answer of model {name} within 60 s"
                    try:
                        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
                        connection.request("POST", "/predict", body=body)
                        answers.append(np.array(connection.getresponse().read().split(), dtype=np.float64))
                        connection.close()
                    except ConnectionRefusedError:  # not listening yet
                        time.sleep(0.05)
                if name == "a":
                    atomic_symlink(link, models["b"])
        except BaseException as e:  # the test fails on it below
            errors.append(e)
        finally:
            os.kill(os.getpid(), signal.SIGTERM)

    # The client's SIGTERM, should it come when the server is not running (it failed to
    # start), must not stop pytest: ignored outside the server's own handler.
    previous = signal.signal(signal.SIGTERM, lambda *_: None)
    thread = threading.Thread(target=client)
    thread.start()
    try:
        code = serve.main(["--model", link, "--port", str(port), "--reload_interval_s", "0.1"])
    finally:
        thread.join()
        signal.signal(signal.SIGTERM, previous)
    assert errors == [] and code == 0
    out = capsys.readouterr().out.splitlines()
    assert out[:2] == [
        f"serving {link} (fp32) on http://127.0.0.1:{port}/predict",
        f"following {link} -> {models['a']}: every 0.1 s",
    ]
    assert out[2:] == [
        f"reloaded {link}: now serving {models['b']} (step 2)",
        f"{link}: answered {len(answers)} requests, {3 * len(answers)} rows; unseen ids 0",
    ]


def test_base_concerns_only_a_delta_the_link_is_switched_to(models):
    """--base names a delta's base: a full export the link names later loads as it is."""
    load = serve.model_loader("fp32", False, models["a"])
    assert load(models["c"]).base == models["a"] and load(models["b"]).base is None
