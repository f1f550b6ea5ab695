import copy

import pytest
from omegaconf import OmegaConf

from common.errors import ConfigError
from settings.compose import compose_config, group_options
from settings.identity import AS_BEFORE, NOT_IDENTITY, digest
from settings.run import run_settings


def test_defaults_are_the_fedcorr_fashion_mnist_scene():
    cfg = compose_config()
    assert (cfg.dataset.name, cfg.partition.name, cfg.noise.name, cfg.num_clients, cfg.seed) == (
        "fashion_mnist", "iid", "fedcorr", 100, 1)
    assert (cfg.noise.rho, cfg.noise.tau, cfg.noise.allow_true_label) == (0.6, 0.5, True)


@pytest.mark.parametrize("group", ["partition", "noise"])
def test_every_preset_of_a_group_is_valid(group):
    for option in group_options(group):
        dataset = {"none": "clothing1m", "human": "cifar10"}.get(option, "digits")
        spec = run_settings(compose_config([f"{group}={option}", f"dataset={dataset}"])).scene
        assert getattr(spec, group).name == option


def test_the_default_out_dir_changes_with_every_scene_setting():
    dirs = {compose_config(list(overrides)).out_dir for overrides in [
        (), ("noise.rho=0.8",), ("noise.tau=0.2",), ("partition=shards",), ("seed=2",), ("num_clients=50",),
        ("dataset=digits",), ("noise=symmetric",), ("noise=symmetric", "noise.eps=0.2"),
    ]}
    assert len(dirs) == 9


def test_runs_of_one_scene_that_compute_different_things_get_folders_of_their_own():
    """A method's option, a learner, the model, an experiment's schedule or a budget: each its own
    folder beside the others of the scene (one parent), so no run replaces another's results."""
    variants = [(), ("strategy=fedavg",), ("strategy=fedavg", "strategy.train.learner=sce"),
                ("strategy=fedavg", "experiment=fmnist"), ("strategy=fedavg", "model=cnn9"),
                ("strategy=fedavg", "comm_budget=300"), ("strategy=fedavg", "strategy.train.lr=0.02"),
                ("strategy.stage3=feddyn",)]
    dirs = [compose_config(list(overrides)).out_dir for overrides in variants]
    assert len(set(dirs)) == len(variants)
    assert len({dir.rsplit("/", 1)[0] for dir in dirs}) == 1, "runs of one scene share its folder"


def test_how_a_run_executes_does_not_move_its_folder():
    """Resuming, the ground truth sim.py adds, live curves, checkpoints, Ray's settings and where the data
    is read from leave the run what it is: the same folder, so resume=true and a re-run find it."""
    default = compose_config([]).out_dir
    for overrides in (["resume=true"], ["ground_truth=true"], ["logging.tensorboard=true"],
                      ["server.checkpoint_every=3"], ["simulation.num_cpus_per_client=2"], ["client.device=cpu"],
                      ["dataset.cache_dir=/tmp/elsewhere"]):
        assert compose_config(overrides).out_dir == default, overrides


@pytest.mark.parametrize("strategy", ["fedcorr", "feddiv"])
def test_an_option_at_its_as_before_value_leaves_the_folder_where_runs_before_it_wrote(strategy):
    """A run of code from before an option existed wrote where the same run writes now (its digest has
    no such key): each ``AS_BEFORE`` option at its value moves no folder, at another value it does."""
    config = OmegaConf.to_container(compose_config([f"strategy={strategy}"]), resolve=True)
    config.pop("out_dir")
    present = [key for key in AS_BEFORE if _has(config, key) and key not in NOT_IDENTITY]
    assert present, "the strategy has options of AS_BEFORE to check"
    for key in present:
        parent, _, leaf = key.rpartition(".")
        node = _node(config, parent)
        assert node[leaf] == AS_BEFORE[key], f"{key} defaults to its as-before value"
        older = copy.deepcopy(config)
        del _node(older, parent)[leaf]
        assert digest(older) == digest(config), key
        other = copy.deepcopy(config)
        _node(other, parent)[leaf] = "another"
        assert digest(other) != digest(config), key


def _node(config, dotted):
    for part in filter(None, dotted.split(".")):
        config = config[part]
    return config


def _has(config, dotted):
    parent, _, leaf = dotted.rpartition(".")
    try:
        return leaf in _node(config, parent)
    except KeyError:
        return False


def test_folder_names_are_plain_words():
    """No ``=`` or Python's ``True`` in a default folder, and FedCorr's noise model, used by every
    method, is not named after FedCorr in a FedNoRo run's path."""
    out_dir = compose_config(["strategy=fednoro"]).out_dir
    assert "=" not in out_dir and "True" not in out_dir and "False" not in out_dir
    assert out_dir.split("/")[3] == "perclient_allow_true_label-on_rho-0.6_tau-0.5"
    assert out_dir.split("/")[-1].startswith("fednoro-") and "fedcorr" not in out_dir
    assert "allow_true_label-off" in compose_config(["noise.allow_true_label=false"]).out_dir


@pytest.mark.parametrize(
    "override,message",
    [
        ("dataset=mnist",
         r"dataset='mnist' is invalid: allowed are cifar10, cifar100, cifar100_coarse, clothing1m, digits, "
         r"fashion_mnist"),
        ("noise=label_swap", r"noise='label_swap' is invalid"),
        ("noise.bogus=1", r"Could not override 'noise.bogus'"),
        ("seed", r"bad override"),
    ],
)
def test_bad_overrides_are_one_clear_error(override, message):
    with pytest.raises(ConfigError, match=message):
        compose_config([override])


@pytest.mark.parametrize("experiment", group_options("experiment"))
@pytest.mark.parametrize("strategy", group_options("strategy"))
def test_every_experiment_preset_is_valid_for_every_strategy(experiment, strategy, tmp_path):
    from server.config import load_run

    extra = []
    if experiment == "clothing1m":  # its ResNet-50 must be pretrained: any existing file passes the up-front check
        (tmp_path / "resnet50.pth").touch()
        extra = [f"model.weights_path={tmp_path / 'resnet50.pth'}"]
    load_run(compose_config([f"experiment={experiment}", f"strategy={strategy}", *extra]))


def test_paper_presets_carry_table_7():
    cfg = compose_config(["experiment=cifar10", "strategy=fedcorr"])
    s = cfg.strategy
    assert (s.t1, s.t2, s.t3, s.theta, s.pi, s.train.lr, s.frac2) == (5, 500, 450, 0.5, 0.5, 0.03, 0.1)
    assert (cfg.num_clients, cfg.model.name, s.beta, s.lid_k, s.mixup_alpha, s.kappa) == \
        (100, "resnet18", 5.0, 20, 1.0, 0.1)
    c1m = compose_config(["experiment=clothing1m", "strategy=fedcorr"])
    assert (c1m.num_clients, c1m.strategy.frac2, c1m.strategy.theta, c1m.strategy.pi, c1m.noise.name) == (
        500, 0.02, 0.9, 0.8, "none")
    assert (c1m.model.name, c1m.model.pretrained) == ("resnet50", True), "Table 1: ImageNet-pretrained ResNet-50"


def test_paper_presets_carry_appendix_b_for_the_baselines():
    """The round-based strategies share each experiment's schedule; presets add only what differs."""
    def strategy(*overrides):
        return compose_config(list(overrides)).strategy

    for name in ("fedavg", "fedprox", "feddyn", "fedmedian", "poc"):
        assert (strategy("experiment=cifar10", f"strategy={name}").num_rounds,
                strategy("experiment=fmnist", f"strategy={name}").num_rounds,
                strategy(f"strategy={name}").num_rounds) == (1000, 100, 50)
        c1m = strategy("experiment=clothing1m", f"strategy={name}")
        assert (c1m.num_rounds, c1m.fraction) == (200, 0.02)
    lrs = {name: strategy("experiment=cifar10", f"strategy={name}").train.lr
           for name in ("fedavg", "fedprox", "feddyn", "fedmedian", "poc")}
    assert lrs == {"fedavg": 0.03, "fedprox": 0.01, "feddyn": 0.1, "fedmedian": 0.01, "poc": 0.01}
    assert strategy("experiment=clothing1m", "strategy=fedprox").train.lr == 0.003
    assert strategy("experiment=smoke", "strategy=poc").d == 6 and strategy("strategy=poc").d == 30


def _train(*overrides):
    from defaults import composed

    return composed("strategy=fednoro", *overrides)["strategy"]["train"]


OPTIMISER = ("optimizer", "lr", "momentum", "weight_decay", "epochs", "batch_size")


def test_fednoro_trains_with_the_shared_local_block_unless_a_source_s_is_chosen():
    shared, fnbench, code = (_train(*choice) for choice in (
        (), ("strategy/local@strategy.train=fnbench",), ("strategy/local@strategy.train=fednoro_code",)))
    assert [shared[k] for k in OPTIMISER] == ["sgd", 0.01, 0.5, 0.0, 5, 10], "FedCorr's block, every strategy's"
    # FNBench on CIFAR (utils/options.py): SGD lr 0.01, momentum 0.9, weight decay 5e-4, E 5, B 64.
    assert [fnbench[k] for k in OPTIMISER] == ["sgd", 0.01, 0.9, 5e-4, 5, 64]
    # FedNoRo's released code: Adam lr 3e-4, weight decay 5e-4, E 5, B 16 (momentum is SGD's only).
    assert [code[k] for k in OPTIMISER if k != "momentum"] == ["adam", 3e-4, 5e-4, 5, 16]
    # Everything else (the learner and its options) is the shared block's.
    for preset in (fnbench, code):
        assert {k: v for k, v in preset.items() if k not in OPTIMISER} == \
            {k: v for k, v in shared.items() if k not in OPTIMISER}


@pytest.mark.parametrize("choice", ["fnbench", "fednoro_code"])
def test_fednoros_source_presets_are_valid_runs(choice):
    from server.config import load_run

    plan = load_run(compose_config(["strategy=fednoro", f"strategy/local@strategy.train={choice}"]))
    train = plan.strategy.settings.train
    assert (train.optimizer, train.weight_decay) == ("adam" if choice == "fednoro_code" else "sgd", 5e-4)


def test_an_unknown_local_preset_is_one_line_naming_the_choices():
    with pytest.raises(ConfigError, match=r"^strategy/local@strategy.train='fnbenc' is invalid: allowed are "
                                          r"fednoro_code, fnbench, sgd$"):
        compose_config(["strategy=fednoro", "strategy/local@strategy.train=fnbenc"])
