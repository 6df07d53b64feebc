"""``python -m summrl.data inspect|prepare [overrides]``: look at a dataset, and write its questions ahead of training.

The overrides are training's (``experiment=local dataset=documents dataset.path=docs/``), composed from
conf/train.yaml, so ``prepare`` fills exactly the question cache the run will read.

- ``inspect``: documents, split sizes, token lengths in the policy's tokens (min / median / max, how many over
  ``dataset.max_document_tokens``), questions per document (given, cached, to write), and what writing the rest
  would call and cost; the same for the rubrics of a rubric reward. Calls nothing.
- ``prepare``: writes and checks the missing questions into the cache (with a progress bar), after the same cost
  guard as training; then, with reward=rubric (or a rubric term) and an LLM judge, the documents' rubrics into the
  reward's cache, after their estimate and a question (y/N). Then a sweep's jobs, and a cloud job (which carries what
  was written here), start with nothing to write.

A bad config or dataset ends with one line and exit code 2, as in training (summrl.errors).
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from pathlib import Path

from summrl import cli, logs
from summrl.config import compose, validate
from summrl.data import load_splits
from summrl.data.documents import policy_token_counter
from summrl.errors import ConfigError, Failure, end, exit_on, run_async, stop_signal
from summrl.judges import missing_keys
from summrl.keys import load_env_file

log = logging.getLogger("summrl.data")


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="python -m summrl.data", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", choices=("inspect", "prepare"))
    parser.add_argument("overrides", nargs="*", help="training's overrides, e.g. dataset=documents dataset.path=docs/")
    args = parser.parse_args(argv)  # a missing or unknown command: its usage and exit code 2
    cli.take_signals()  # SIGTERM, as Ctrl-C: the line that says what is cached, and exit 143 (was: killed at once)
    command, overrides = args.command, args.overrides
    logs.console()
    load_env_file()  # keys, and any ${oc.env:X} of the overrides, as for training
    try:
        # no run folder: nothing is trained (run.dir would name Hydra's, which only a run has)
        config = validate(compose("train", [*overrides, "run.dir=.", "run.name=data"], return_hydra_config=True))
        if config.dataset.kind == "inbox":
            raise ConfigError("dataset=inbox: summrl.data reads dataset=documents or repliqa; a run's inbox is read, "
                              "and its questions written, by `python -m summrl.train run.name=<name> dataset=inbox` "
                              "(see the README's \"Keep it learning\")")
        run_async(inspect(config) if command == "inspect" else prepare(config))
    except KeyboardInterrupt:  # Ctrl-C while writing: what was written (and paid for) is in the caches
        end(Failure("interrupted", f"stopped ({stop_signal()}); the questions and rubrics written so far are cached: "
                                   "the same command writes only the rest"))
    except Exception as e:
        exit_on(e)


async def inspect(config) -> None:
    from summrl import splits  # heavy (litellm, ART through the cost guard): after the config is known to be good

    from summrl.rewards import rubric

    dataset = config.dataset
    if dataset.kind == "repliqa":
        val, train = load_splits(dataset)
        print(f"summrl: dataset {dataset.name}: {len(val) + len(train)} documents used ({len(val)} val, "
              f"{len(train)} train), each with its questions")
        print_rubric_plans(rubric.plans(config, [*val, *train]))
        return
    count = policy_token_counter(config.model)
    loaded = splits.read_documents(config, count)
    val, train = splits.split_whole(loaded, dataset)  # (refuses a dataset whose documents are all skipped)
    lengths = splits.token_lengths(loaded.documents, count)
    limit = dataset.max_document_tokens
    print(f"summrl: token lengths ({config.model.base_model}'s tokenizer): min {lengths['min']}, median "
          f"{lengths['median']:g}, max {lengths['max']}; limit {limit if limit else 'none'}"
          + (f", {loaded.long['over_limit']} documents were over it" if limit else ""))
    print(f"summrl: split (dataset.seed={dataset.seed}): {len(val)} val, {len(train)} train")
    given = sum(bool(d.questions) for d in loaded.documents)
    need = splits.needing_questions(val, train, splits.needs_questions(config, True))
    print(f"summrl: questions: {given} documents bring their own; {len(need)} need them written "
          f"({dataset.questions.per_document} each, {dataset.questions.unanswerable_share:.0%} unanswerable"
          f"{', checked open and closed book' if dataset.questions.check else ', unchecked'})")
    bank = splits.question_bank(config, lookup_only=True)  # it calls nothing: the estimate needs no key
    client = bank.writer.client
    pending, calls = splits.plan(bank, need, client.model if client is not None else None)
    print(splits.describe(calls, len(pending), len(need) - len(pending)))
    if pending and (missing := missing_keys(config.judge)):
        print(f"summrl: questions: writing them needs {missing[0]} (the judge's key): export it, or put it in .env")
    print_rubric_plans(rubric.plans(config, [*val, *train]))


def print_rubric_plans(planned) -> None:
    """What ``prepare`` would write of the rubrics (reward=rubric, or a rubric term, with an LLM judge)."""
    found, notes = planned
    for line in [*notes, *(plan.line() for plan in found)]:
        print(line)


async def prepare(config) -> None:
    from summrl import splits  # heavy, as above
    from summrl.rewards import rubric

    if config.dataset.kind == "repliqa":
        print(f"summrl: dataset {config.dataset.name} brings its questions: no questions to prepare")
        val, train = load_splits(config.dataset)
        await rubric.prepare(config, [*val, *train])
        return
    started = time.monotonic()
    loaded = splits.read_documents(config)
    val, train = splits.split_whole(loaded, config.dataset)
    # as training does it: the documents its question check leaves out are named, and a split it would leave empty
    # is training's config error, here (prepare said all was well, and the run was refused)
    made = await splits.with_questions(config, loaded, val, train, train_needs=splits.needs_questions(config, True),
                                       train_required=True, progress=True)
    q = made.record["questions"]
    rate = q["closed_book_answer_rate"]
    print(f"summrl: prepared {q['generated_documents']} documents in {time.monotonic() - started:.1f} s: "
          f"{q['written_now']} written now, {q['cache_hits']} from the cache "
          f"({Path(config.dataset.questions.cache_dir).expanduser()}); "
          f"questions written {q['written']}, kept {q['kept']}, dropped "
          f"{', '.join(f'{k} {v}' for k, v in q['dropped'].items())}; closed-book answer rate "
          f"{'n/a' if rate is None else f'{rate:.1%}'}"
          + (f"; judge cost ${q['cost_usd']:.4f} in {q['calls']} calls" if q["calls"] else ""))
    await rubric.prepare(config, [*made.val, *made.train])  # not those the question check left out


if __name__ == "__main__":
    main(sys.argv[1:])
