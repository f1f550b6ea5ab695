"""What every strategy of ours shares: a name and typed settings, clients addressed by partition id,
replies checked (failure policy and protocol) before aggregation, and one run log whose observer
sees every finished round."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Result, Strategy

from common.errors import ConfigError
from common.validation import Checked, type_hints
from protocol.codec import ProtocolError
from protocol.messages import StateScope, read_arrays, read_reply, with_scope
from strategies.context import StrategyContext
from strategies.federation import Federation
from strategies.replies import answering_node, short_reason
from task.local_training import TrainStats

log = logging.getLogger(__name__)

T = TypeVar("T")


class ClientFailure(RuntimeError):
    """A client raised, did not answer in time or sent a bad reply, and the policy says the round fails."""


@dataclass(frozen=True)
class RoundInfo:
    """One finished round: which clients trained, in which stage, and the participations so far."""

    round: int
    stage: str
    clients: list[int]
    comm_cost: int
    train_loss: float | None


RoundObserver = Callable[[RoundInfo, ArrayRecord], MetricRecord | None]
"""Called once per finished round with the new global arrays; may return metrics of the global model
(the server's central evaluation), which the strategy's ``Result`` keeps for that round."""


class RunLog:
    """The rounds a run has finished, shared by a strategy and the strategies nested in it (FedCorr's
    stage 3), so rounds and communication cost run on across stages.

    observer: sees every finished round (``RoundObserver``); None until the server attaches one.
    checkpoint: called after every finished round with its number and the new global arrays, once
        the strategy's state is whole again (the server's checkpoints); None: no checkpoints.
    scope: the ``StateScope`` of the instructions of a round, by round (the server's, which knows
        the run's key and checkpoints); None: instructions carry no scope and nodes keep their state
        in memory.
    completed: the last finished round (0 before the first); current: the round in progress.
    answered: each partition's last round with a good reply to an instruction; a run that continues
        from a checkpoint asks every node whether its state still says as much (``server.held``).
    """

    def __init__(self) -> None:
        self.rounds: list[RoundInfo] = []
        self.observer: RoundObserver | None = None
        self.checkpoint: Callable[[int, ArrayRecord], None] | None = None
        self.scope: Callable[[int], StateScope] | None = None
        self.result = Result()
        self.completed = 0
        self.current = 0
        self.answered: dict[int, int] = {}

    @property
    def comm_cost(self) -> int:
        """Client participations so far (the FedCorr paper's communication cost)."""
        return self.rounds[-1].comm_cost if self.rounds else 0

    def record(self, info: RoundInfo, arrays: ArrayRecord) -> None:
        """Log a finished round, show it to the observer and keep its metrics in the Result."""
        self.rounds.append(info)
        self.result.arrays = arrays
        if info.train_loss is not None:
            self.result.train_metrics_clientapp[info.round] = MetricRecord({"train-loss": info.train_loss})
        scores = self.observer(info, arrays) if self.observer is not None else None
        if scores is not None:
            self.result.evaluate_metrics_serverapp[info.round] = scores

    def state(self) -> dict[str, Any]:
        """What a checkpoint keeps of the log: the rounds, their metrics, the last finished round and
        each partition's last answered round."""
        return {"rounds": list(self.rounds), "completed": self.completed, "answered": dict(self.answered),
                "train_metrics": dict(self.result.train_metrics_clientapp),
                "evaluate_metrics": dict(self.result.evaluate_metrics_serverapp)}

    def restore(self, state: dict[str, Any]) -> None:
        """Continue from a checkpoint's ``state()``."""
        self.rounds = list(state["rounds"])
        self.completed = self.current = int(state["completed"])
        # A checkpoint written before nodes recorded their rounds holds none, and nothing is checked.
        self.answered = dict(state.get("answered", {}))
        self.result.train_metrics_clientapp.update(state["train_metrics"])
        self.result.evaluate_metrics_serverapp.update(state["evaluate_metrics"])


@dataclass(frozen=True)
class TrainReply:
    """A checked ``train`` reply: the trained arrays, the client's stats, and its plug-in's reply
    payload (None when the plug-in sends none)."""

    arrays: ArrayRecord
    result: TrainStats
    extra: Any = None


class StrategySettings(Checked):
    """Base of a strategy's settings: frozen dataclasses whose options are declared once
    (``common.validation.option``) and whose defaults come from ``conf/strategy/<name>.yaml``."""

    def check_run(self, context: StrategyContext) -> None:
        """Checks that need the run (federation size, budget, ground truth); an ``InvalidValue`` names
        its key within the strategy's block (none by default)."""

    def starts_from(self, num_clients: int) -> tuple[str, int] | None:
        """The folder of a finished run and the round of its checkpoint this run starts from instead
        of round 0 (FedCorr's ``stages12_from``); None: from round 0."""
        return None

    def differing_keys(self) -> tuple[str, ...]:
        """The keys of the strategy block in which a run may differ from the run it starts from."""
        return ()


class FederatedStrategy(Strategy):
    """Base class of every strategy: one class per file, found by its ``name``, built from its
    settings (the type its ``settings`` attribute declares) and the run's context.

    Subclasses implement ``planned_rounds`` and Flower's ``configure_train`` / ``aggregate_train`` using
    ``messages``, ``collect``/``exchange`` and ``record_round``; ``start`` runs them in the round loop
    (Flower's, from the run log's last finished round) and returns the run log's ``Result``. Every
    attribute but the ``transient`` ones is the strategy's state, which checkpoints keep. The
    client-sampling generator is ``context.rng``; with ``context.skip_failed`` a client that raises,
    times out or sends a bad reply is dropped from its round with a warning, else the run stops naming
    it (``server.on_client_error``).
    """

    name: ClassVar[str]
    settings: StrategySettings
    min_client_samples: ClassVar[int] = 1
    """The fewest samples a client may hold (LID needs a neighbour, a loss mixture two losses)."""
    late_joiners: ClassVar[bool] = True
    """Whether it works with clients that join late (``context.participation``); one that queries every
    client in some round does not."""
    needs_parameter_names: ClassVar[bool] = False
    """Whether its state or its clients' follows the model's parameters by name (``context.parameter_names``)."""
    transient: ClassVar[frozenset[str]] = frozenset({
        "settings", "context", "rng", "skip_failed", "log", "timeout", "global_arrays", "_federation", "_sent"})
    """Attributes that are not the strategy's state: built again from the settings and the run on
    resume, or shared with the run (the sampling generator and the run log, which the server's
    checkpoint keeps once). Every other attribute is state and goes into ``state()``; a subclass
    that holds more wiring adds its names."""
    budget_sized: ClassVar[frozenset[str] | None] = None
    """The attributes that ``comm_budget`` sizes, which a run extending a shorter run of the same config
    (``extend_from``) computes for its own budget instead of taking over; every other part of its state
    must not depend on the budget. None: the budget shapes earlier rounds too (a warm-up of a tenth of
    the rounds), so the strategy cannot extend a run."""

    def __init__(self, settings: StrategySettings, context: StrategyContext) -> None:
        if self.needs_parameter_names and not context.parameter_names:
            raise ConfigError(f"{self.name} needs the model's parameter names; none were given")
        self.settings = settings
        self.context = context
        self.rng = context.rng
        self.skip_failed = context.skip_failed
        self.log = RunLog()
        self.timeout = 3600.0
        self.global_arrays: ArrayRecord | None = None  # what this round's clients start from
        self._federation: Federation | None = None
        self._sent: dict[int, Message] = {}

    @classmethod
    def settings_type(cls) -> type[StrategySettings]:
        """The settings dataclass the strategy is built from: the type of its ``settings``."""
        declared = type_hints(cls)["settings"]
        assert isinstance(declared, type) and issubclass(declared, StrategySettings)
        return declared

    @classmethod
    def check_run(cls, settings: StrategySettings, context: StrategyContext) -> None:
        """Every check of ``settings`` that needs the run, before any work (``settings.check_run``), and
        late joiners only for a strategy that works with them."""
        if context.participation.late and not cls.late_joiners:
            raise ConfigError(f"participation.late={context.participation.share(context.num_clients):g} is invalid: "
                              f"0 with strategy={cls.name}, which queries every client in some rounds")
        settings.check_run(context)

    @property
    def federation(self) -> Federation:
        """The partition-to-node map given by ``bind``; an error before the server binds one."""
        if self._federation is None:
            raise RuntimeError("bind(federation) must be called before the strategy starts")
        return self._federation

    def bind(self, federation: Federation) -> None:
        """Tell the strategy which node holds which partition (from the server's discovery round)."""
        self._federation = federation

    def observe(self, observer: RoundObserver) -> None:
        """Show every finished round to ``observer``."""
        self.log.observer = observer

    @property
    def history(self) -> list[RoundInfo]:
        """The rounds finished so far, across every stage that shares this run log."""
        return self.log.rounds

    def present(self, server_round: int) -> list[int]:
        """The clients that take part in round ``server_round`` (all but late joiners not yet joined)."""
        return self.context.participation.present(self.federation.partition_ids, server_round)

    @property
    def comm_cost(self) -> int:
        """Client participations so far (see ``RunLog.comm_cost``)."""
        return self.log.comm_cost

    def planned_rounds(self) -> int:
        """How many rounds the run will take (for progress and the final evaluation)."""
        raise NotImplementedError

    def planned_clients(self, server_round: int) -> int:
        """How many clients round ``server_round`` trains, as far as the strategy knows now (the
        progress line's ETA weighs each round left by it)."""
        raise NotImplementedError

    def result_blocks(self) -> dict[str, Any]:
        """The strategy's own blocks of results.json (e.g. FedCorr's detection metrics)."""
        return {}

    def result_arrays(self) -> dict[str, dict[str, np.ndarray]]:
        """The strategy's arrays too large for results.json, by file (FedCorr's ``confusion.npz``)."""
        return {}

    def stage_ends(self) -> list[int]:
        """The rounds after which one of the strategy's stages ends (the server keeps a checkpoint of
        each); none for a strategy of one stage."""
        return []

    def state(self) -> dict[str, Any]:
        """Everything the strategy has learnt or decided so far: every attribute but the ``transient``
        ones, as a checkpoint keeps it (picklable)."""
        return {name: value for name, value in vars(self).items() if name not in self.transient}

    def inherit(self, state: dict[str, Any]) -> None:
        """Continue from the ``state()`` of another run's checkpoint at ``settings.starts_from``; only
        a strategy whose settings name such a run implements it."""
        raise NotImplementedError(f"{type(self).__name__} does not start from another run")

    @classmethod
    def extends(cls, settings: StrategySettings) -> bool:
        """Whether a run with ``settings`` can extend a shorter run of its config (``budget_sized``)."""
        return cls.budget_sized is not None

    def extend(self, state: dict[str, Any]) -> None:
        """Continue from the ``state()`` of the last checkpoint of a run that differs from this one only
        in a smaller budget (``extend_from``): all of it but what the budget sizes."""
        if self.budget_sized is None:
            raise NotImplementedError(f"{type(self).__name__} cannot extend a run: the budget shapes its early rounds")
        own = {name: getattr(self, name) for name in self.budget_sized if hasattr(self, name)}
        self.restore({**state, **own})

    def restore(self, state: dict[str, Any]) -> None:
        """Continue from ``state()`` of a strategy built and bound with the same settings. A checkpoint
        of another version of the strategy, with state this one lacks or lacking state this one keeps
        (whose fresh value would not be what the run had learnt), is refused."""
        unknown = sorted(set(state) - set(vars(self)))
        missing = sorted(set(vars(self)) - set(state) - self.transient)
        for names, how in ((unknown, "holds {} state {} that this version of the strategy does not have"),
                           (missing, "lacks {} state {} that this version of the strategy keeps")):
            if names:
                raise RuntimeError(f"the checkpoint {how.format(type(self).__name__, names)}; resume with the "
                                   "version that wrote it")
        for name, value in state.items():
            setattr(self, name, value)

    def node_state(self) -> bool:
        """Whether its clients keep state that later rounds read back (corrected labels, a correction
        term, a prior): a run that continues a checkpoint then checks that every node still holds it
        (``server.held``). True unless the strategy knows its clients keep none, so that a node with an
        emptied state-dir, which would compute the same, is not refused."""
        return True

    def summary(self) -> None:
        """Log the strategy's class, its rounds and its failure policy."""
        log.info("%s: %d rounds, skip_failed=%s", type(self).__name__, self.planned_rounds(), self.skip_failed)

    # --- messages ------------------------------------------------------------------------------

    def messages(self, contents: dict[int, RecordDict], message_type: str) -> list[Message]:
        """One message per client (partition id -> its content), with the current round's state scope
        when the server gives one; remembers whom it was sent to."""
        if self.log.scope is not None:
            scope = self.log.scope(self.log.current)
            for content in contents.values():
                with_scope(content, scope)
        self._sent = {
            pid: Message(content=content, message_type=message_type, dst_node_id=self.federation.node_of[pid])
            for pid, content in contents.items()
        }
        return list(self._sent.values())

    def partition_of_reply(self, reply: Message) -> int:
        """The partition a reply answers for (see ``answering_node``)."""
        return self.federation.partition_of(answering_node(reply, self._sent.values()))

    def exchange(self, grid: Grid, contents: dict[int, RecordDict], message_type: str,
                 read: Callable[[RecordDict, str], T]) -> dict[int, T]:
        """Send, wait at most ``timeout`` seconds, and return the checked replies (see ``collect``)."""
        return self.collect(grid.send_and_receive(self.messages(contents, message_type), timeout=self.timeout), read)

    def collect(self, replies: Iterable[Message], read: Callable[[RecordDict, str], T]) -> dict[int, T]:
        """Replies by partition id, each decoded by ``read(content, sender)``, after the failure
        policy: a client that raised, was silent or sent a reply ``read`` refuses has failed."""
        good: dict[int, T] = {}
        failed: dict[int, str] = {}
        for reply in replies:
            pid = self.partition_of_reply(reply)
            if reply.has_error():
                log.debug("client %d failed with:\n%s", pid, reply.error.reason)
                failed[pid] = f"client {pid} failed: {short_reason(reply.error.reason)}"
                continue
            try:
                good[pid] = read(reply.content, f"client {pid}")
            except ProtocolError as err:
                failed[pid] = str(err)
                continue
            self.log.answered[pid] = self.log.current
        for pid in self._sent:
            if pid not in good and pid not in failed:
                failed[pid] = f"client {pid} did not reply in time"
        if failed and (not self.skip_failed or not good):
            left = "" if good else " (no client left in the round)"
            raise ClientFailure("; ".join(failed[pid] for pid in sorted(failed)) + left)
        for pid in sorted(failed):
            log.warning("%s; skipped (server.on_client_error=skip)", failed[pid])
        return dict(sorted(good.items()))

    def read_train(self, content: RecordDict, sender: str) -> TrainReply:
        """A ``train`` reply: arrays shaped like the global model's, and the client's report."""
        return TrainReply(read_arrays(content, sender, like=self.global_arrays),
                          read_reply(content, TrainStats, sender))

    # --- rounds --------------------------------------------------------------------------------

    def record_round(self, server_round: int, stage: str, clients: list[int], train_loss: float | None,
                     arrays: ArrayRecord) -> RoundInfo:
        """Log a finished round with the new global ``arrays``; the observer sees it."""
        info = RoundInfo(server_round, stage, sorted(clients), self.comm_cost + len(clients), train_loss)
        self.log.record(info, arrays)
        return info

    def finish(self, grid: Grid, arrays: ArrayRecord) -> None:
        """Work due after the last round (none by default; FedCorr's pending corrections)."""

    def start(
        self,
        grid: Grid,
        initial_arrays: ArrayRecord,
        num_rounds: int | None = None,
        timeout: float = 3600,
        train_config: ConfigRecord | None = None,
        evaluate_config: ConfigRecord | None = None,
        evaluate_fn: Callable[[int, ArrayRecord], MetricRecord | None] | None = None,
    ) -> Result:
        """Run the rounds after the run log's last finished one (all ``planned_rounds()`` of a fresh
        run; ``num_rounds`` must agree if given), then ``finish``.

        Flower's own loop always starts at round 1; this one continues a restored run from
        ``initial_arrays``, the checkpoint's global model. Each round: ``configure_train``, the
        exchange (at most ``timeout`` seconds), ``aggregate_train``, ``evaluate_fn`` if given, then the
        run log's ``checkpoint``. Clients train with the strategy's own local-training settings
        (``train_config`` and ``evaluate_config`` are not used: no client evaluates). Returns the run
        log's Result: the final arrays, each round's train loss and whatever the observer returned.
        """
        planned = self.planned_rounds()
        if num_rounds is not None and num_rounds != planned:
            raise ValueError(f"{type(self).__name__} runs {planned} rounds; num_rounds={num_rounds} disagrees")
        self.timeout = float(timeout)
        self.summary()
        arrays = initial_arrays
        self.log.result.arrays = arrays
        config = ConfigRecord() if train_config is None else train_config
        for server_round in range(self.log.completed + 1, planned + 1):
            self.log.current = server_round
            replies = grid.send_and_receive(self.configure_train(server_round, arrays, config, grid), timeout=timeout)
            aggregated, _ = self.aggregate_train(server_round, replies)
            arrays = arrays if aggregated is None else aggregated
            if evaluate_fn is not None:
                scores = evaluate_fn(server_round, arrays)
                if scores is not None:
                    self.log.result.evaluate_metrics_serverapp.setdefault(server_round, scores)
            self.log.completed = server_round
            if self.log.checkpoint is not None:
                self.log.checkpoint(server_round, arrays)
        self.log.current = planned + 1
        self.finish(grid, arrays)
        return self.log.result

    def configure_evaluate(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                           grid: Grid) -> Iterable[Message]:
        """No client evaluates: the observer evaluates the global model centrally."""
        # The global model is evaluated centrally on the test split, by the observer.
        return []

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]) -> MetricRecord | None:
        """Nothing to aggregate: no client evaluates (see ``configure_evaluate``)."""
        return None
