"""Bad input, table-driven: every mistake on the command lines of sim.py, scene.py and export.py is one
line ``<key>=<value> is invalid: <what is allowed>`` before any work: no file or folder written, no
Ray started. Most cases go through the entry points those commands call first (``sim.preflight``,
``scene.main``, ``export.main``), in this process; a sample runs the real commands as subprocesses
(e2e tier) for the ``error:`` prefix and exit status 2."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import export as export_command
import scene as scene_command
import sim
from common.errors import ConfigError

REPO = Path(__file__).resolve().parents[1]
SMOKE = ["experiment=smoke"]

# (overrides after experiment=smoke, the key=value the one line must start with)
SIM_CASES = [
    # Hydra: groups, keys, the override grammar, sweeps
    ("experiment=smok", "experiment='smok'"),
    ("model=foo", "model='foo'"),
    ("strategy=fedmagic", "strategy='fedmagic'"),
    ("noise=label_swap", "noise='label_swap'"),
    ("partition=random", "partition='random'"),
    ("dataset=mnist", "dataset='mnist'"),
    ("+num_client=5", "num_client=5"),
    ("stratgy=fedavg", "stratgy=fedavg"),
    ("noise.rhoo=1", "noise.rhoo=1"),
    ("seed=1,2", "seed=1,2"),
    ("seed=[1", "seed=[1"),
    ("strategy.zz=1", "strategy.zz=1"),
    ("++strategy.zz=1", "strategy.zz=1"),
    ("-m seed=1,2 noise.rho=5", "noise.rho=5"),
    ("-m strategy=fedavg,fedprox strategy.mu=0.5", "strategy.mu=0.5"),
    ("-m seed=interval(0,1)", "seed=interval(0,1)"),
    ("-m seed=1,2 hydra.sweep.dir=/proc/no-such-sweep", "hydra.sweep.dir='/proc/no-such-sweep'"),
    ("~seed", "~seed"),
    ("~strategy.train.lr", "strategy.train.lr=<unset>"),
    ("~strategy.train", "strategy.train=<unset>"),
    ("dataset.transforms.train.crop=-3", "dataset.transforms.train.crop=-3"),
    ("+dataset.transforms.train.crop=-3", "dataset.transforms.train.crop=-3"),
    ("dataset.num_classes=3", "dataset.num_classes=3"),
    ("model=resnet50 model.weights_path=/nonexistent", "model.weights_path='/nonexistent'"),
    ("strategy.stage3_options.poc.d=abc", "strategy.stage3_options.poc.d='abc'"),
    # the run's own values
    ("seed=-1", "seed=-1"),
    ("seed=4294967296", "seed=4294967296"),
    ("seed=abc", "seed='abc'"),
    ("num_clients=0", "num_clients=0"),
    ("num_clients=100000", "num_clients=100000"),
    ("num_clients=1000", "num_clients=1000"),  # FedCorr's LID needs 2 samples; digits' 1437 leave some 1
    ("comm_budget=0", "comm_budget=0"),
    ("ground_truth=maybe", "ground_truth='maybe'"),
    ("logging.tensorboard=maybe", "logging.tensorboard='maybe'"),
    ("server.on_client_error=ignore", "server.on_client_error='ignore'"),
    ("server.eval_every=0", "server.eval_every=0"),
    ("server.round_timeout=-5", "server.round_timeout=-5"),
    ("server.device=cuda", "server.device='cuda'"),
    ("server.device=tpu", "server.device='tpu'"),
    ("client.device=cuda:7", "client.device='cuda:7'"),
    ("simulation.num_cpus_per_client=0", "simulation.num_cpus_per_client=0"),
    ("simulation.num_cpus_per_client=99", "simulation.num_cpus_per_client=99"),
    ("simulation.num_gpus_per_client=-1", "simulation.num_gpus_per_client=-1"),
    ("simulation.verbose=maybe", "simulation.verbose='maybe'"),
    ("simulation.ray_init_args.foo=1", "simulation.ray_init_args.foo=1"),
    ("+simulation.ray_init_args.foo=1", "simulation.ray_init_args.foo=1"),
    ("+simulation.ray_init_args.num_cpus=abc", "simulation.ray_init_args.num_cpus='abc'"),
    ("+simulation.ray_init_args.object_store_memory=1", "simulation.ray_init_args.object_store_memory=1"),
    ("+simulation.ray_init_args.address=127.0.0.1:1", "simulation.ray_init_args.address='127.0.0.1:1'"),
    ("simulation.ray_address=127.0.0.1:1", "simulation.ray_address='127.0.0.1:1'"),
    ("simulation.ray_address=nowhere", "simulation.ray_address='nowhere'"),
    ("out_dir=", "out_dir=''"),
    ("out_dir=/proc/no-such-run", "out_dir='/proc/no-such-run'"),
    # the scene
    ("noise.rho=1.5", "noise.rho=1.5"),
    ("noise.tau=-0.1", "noise.tau=-0.1"),
    ("noise.allow_true_label=maybe", "noise.allow_true_label='maybe'"),
    ("noise=gaussian noise.std=inf", "noise.std=inf"),
    ("noise=gaussian noise.mean=nan", "noise.mean=nan"),
    ("noise=gaussian noise.std=" + "9" * 400, "noise.std=" + "9" * 400),  # no float holds it
    ("noise=gaussian noise.kind=diagonal", "noise.kind='diagonal'"),
    ("noise=symmetric noise.eps=1.5", "noise.eps=1.5"),
    ("noise=pairflip noise.eps=inf", "noise.eps=inf"),
    ("noise=pairflip noise.direction=left", "noise.direction='left'"),
    ("strategy=fednoro strategy/local@strategy.train=fnbenc", "strategy/local@strategy.train='fnbenc'"),
    ("partition=dirichlet partition.alpha=inf", "partition.alpha=inf"),
    ("partition=dirichlet partition.alpha=0", "partition.alpha=0"),
    ("partition=fedcorr_noniid partition.p=1.5", "partition.p=1.5"),
    ("dataset.root=/nonexistent", "dataset.root='/nonexistent'"),
    # strategies
    ("strategy.lid_k=1", "strategy.lid_k=1"),
    ("strategy.t1=0", "strategy.t1=0"),
    ("strategy.pi=2", "strategy.pi=2"),
    ("strategy.stage3=fedmagic", "strategy.stage3='fedmagic'"),
    ("strategy.ablation.mixup=maybe", "strategy.ablation.mixup='maybe'"),
    ("strategy.train.lr=0", "strategy.train.lr=0"),
    ("strategy.train.lr=maybe", "strategy.train.lr='maybe'"),
    ("strategy.train.momentum=1", "strategy.train.momentum=1"),
    ("strategy.train.learner=dividemix", "strategy.train.learner='dividemix'"),
    ("strategy=fedavg strategy.fraction=0", "strategy.fraction=0"),
    ("strategy=fedavg strategy.num_rounds=-1", "strategy.num_rounds=-1"),
    ("strategy=poc strategy.d=1000", "strategy.d=1000"),
    ("strategy=fednoro strategy.warmup=100", "strategy.warmup=100"),
    ("strategy=feddiv strategy.zeta=2", "strategy.zeta=2"),
    ("strategy=fedes strategy.s1=100", "strategy.s1=100"),
    ("strategy=fedes strategy.rho_source=oracle ground_truth=false", "strategy.rho_source='oracle'"),
    ("strategy.joiners=sometimes", "strategy.joiners='sometimes'"),
    ("strategy.stage2_keep=0", "strategy.stage2_keep=0"),
    # dynamic participation
    ("participation.late=1", "participation.late=1"),
    ("participation.join_round=1", "participation.join_round=1"),
    ("strategy=fednoro participation.late=0.3", "participation.late=0.3"),
    ("participation.late=0.3 participation.join_round=500", "participation.join_round=500"),
]

SCENE_CASES = [
    ("experiment=smok", "experiment='smok'"),
    ("-m", "-m"),
    ("scene.plot=maybe", "scene.plot='maybe'"),
    ("+foo=1", "foo=1"),
    ("noise.rho=2", "noise.rho=2"),
    ("partition=dirichlet partition.alpha=-1", "partition.alpha=-1"),
]

EXPORT_CASES = [
    ("export.true_labels=maybe", "export.true_labels='maybe'"),
    ("+export.format=csv", "export.format=csv"),
    ("seed=-1", "seed=-1"),
    ("num_clients=0", "num_clients=0"),
]


def _one_line(message: str, starts: str) -> None:
    assert "\n" not in message.strip(), f"more than one line: {message!r}"
    assert message.startswith(f"{starts} is invalid: "), message


@pytest.fixture
def empty_folder(tmp_path, monkeypatch):
    """Run from an empty folder: the default out_dir is relative, so anything written lands here."""
    monkeypatch.chdir(tmp_path)
    yield tmp_path
    assert list(tmp_path.iterdir()) == [], "a refused command left files behind"


@pytest.fixture
def no_ray():
    import ray

    yield
    assert not ray.is_initialized(), "Ray was started"


def _words(case: str, tmp: Path) -> list[str]:
    return [*SMOKE, *case.replace("{tmp}", str(tmp)).split()]


def test_there_are_at_least_sixty_distinct_cases():
    cases = {(command, case) for command, table in (("sim", SIM_CASES), ("scene", SCENE_CASES),
                                                     ("export", EXPORT_CASES)) for case, _ in table}
    assert len(cases) >= 60


@pytest.mark.parametrize(("case", "starts"), SIM_CASES)
def test_sim_refuses_before_any_work(case, starts, empty_folder, no_ray):
    with pytest.raises(ConfigError) as caught:
        sim.preflight(_words(case, empty_folder))
    _one_line(str(caught.value), starts)


@pytest.mark.parametrize(("command", "case", "starts"),
                         [("scene", *row) for row in SCENE_CASES] + [("export", *row) for row in EXPORT_CASES])
def test_scene_and_export_refuse_before_any_work(command, case, starts, empty_folder, no_ray, capsys):
    main = scene_command.main if command == "scene" else export_command.main
    assert main(_words(case, empty_folder)) == 2
    out, err = capsys.readouterr()
    assert out == ""
    _one_line(re.sub(r"^error: ", "", err.strip()), starts)
    assert err.startswith("error: ")


def test_an_out_dir_that_is_or_lies_under_a_file_is_refused(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    for out_dir in (blocker, blocker / "run"):
        with pytest.raises(ConfigError) as caught:
            sim.preflight([*SMOKE, f"out_dir={out_dir}"])
        _one_line(str(caught.value), f"out_dir='{out_dir}'")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file"]


def test_a_valid_command_line_passes_every_check_and_still_writes_nothing(empty_folder, no_ray):
    plans = sim.preflight([*SMOKE, "-m", "seed=1,2", "strategy=fedavg,fednoro"])
    assert [(p.settings.seed, p.strategy.name) for p in plans] == [(1, "fedavg"), (1, "fednoro"),
                                                                    (2, "fedavg"), (2, "fednoro")]
    # One-sample clients are fine for FedAvg; FedCorr's LID needs two (the case above).
    assert sim.preflight([*SMOKE, "strategy=fedavg", "num_clients=1000"])


def test_a_ray_address_passes_when_something_answers_there():
    import socket

    from settings.run import check_ray_address

    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
        check_ray_address("simulation.ray_address", f"127.0.0.1:{port}")
        check_ray_address("simulation.ray_address", f"ray://127.0.0.1:{port}")
    for local in (None, "auto"):
        check_ray_address("simulation.ray_address", local)


def test_a_folder_holding_another_runs_results_is_refused_and_the_same_run_may_replace_its_own(tmp_path):
    """A run may not write into a folder whose results.json is another run's (another config outside
    the keys that only say how a run executes); the same run again may, whatever it records or logs."""
    import json

    from server.config import load_run
    from settings.compose import compose_config

    out = tmp_path / "run"
    earlier = load_run(compose_config([*SMOKE, "strategy=fedavg", f"out_dir={out}"])).settings.resolved
    out.mkdir()
    results = out / "results.json"
    results.write_text(json.dumps({"complete": True, "config": earlier}))
    before = sorted(p.name for p in out.iterdir())
    with pytest.raises(ConfigError) as caught:
        sim.preflight([*SMOKE, "strategy=fedavg", "strategy.train.learner=sce", f"out_dir={out}"])
    _one_line(str(caught.value), f"out_dir='{out}'")
    assert "strategy.train.learner (ce -> sce)" in str(caught.value) and "replace=true" in str(caught.value)
    assert sorted(p.name for p in out.iterdir()) == before, "nothing written"
    sim.preflight([*SMOKE, "strategy=fedavg", "ground_truth=false", "logging.tensorboard=false", f"out_dir={out}"])
    sim.preflight([*SMOKE, "strategy=fedavg", "strategy.train.learner=sce", "replace=true", f"out_dir={out}"])
    results.write_text("{not json")  # a results file no run can be read from is not another run's
    sim.preflight([*SMOKE, "strategy=fedavg", "strategy.train.learner=sce", f"out_dir={out}"])


def test_a_setting_only_the_swept_choices_have_reaches_hydras_multirun_forced():
    """Hydra composes a multirun once with each swept group at its default (FedCorr has no num_rounds),
    so ``-m strategy=fedavg,fedprox strategy.num_rounds=1`` would fail there after passing every job's
    check; the override goes to Hydra as ``++``, which that composition takes and every job sets alike."""
    from settings.command_line import for_hydra
    from settings.compose import compose_config

    argv = ["-m", "strategy=fedavg,fedprox", "strategy.num_rounds=1", "seed=1,2", "experiment=smoke", "noise.rho=0.2"]
    assert [plan.settings.resolved["strategy"]["num_rounds"] for plan in sim.preflight(argv)] == [1, 1, 1, 1]
    assert for_hydra(argv) == ["-m", "strategy=fedavg,fedprox", "++strategy.num_rounds=1", "seed=1,2",
                               "experiment=smoke", "noise.rho=0.2"]
    with pytest.raises(ConfigError, match="strategy.num_rounds"):
        compose_config(["experiment=smoke", "strategy.num_rounds=1"])  # Hydra's composition before the jobs
    assert compose_config(["experiment=smoke", "++strategy.num_rounds=1"])["strategy"]["num_rounds"] == 1
    for job in (["strategy=fedavg"], ["strategy=fedprox"]):  # and each job gets what the plain override gave
        assert (compose_config([*job, "experiment=smoke", "++strategy.num_rounds=1"])
                == compose_config([*job, "experiment=smoke", "strategy.num_rounds=1"]))
    plain = ["strategy=fedavg", "strategy.num_rounds=1", "experiment=smoke"]
    assert for_hydra(plain) == plain, "one run: Hydra composes just that job"
