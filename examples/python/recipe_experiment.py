#!/usr/bin/env python3
"""Runs a recipe experiment through tallyd and prints its variant table.

    pip install ./python
    python examples/python/recipe_experiment.py            # the demo's recipe-ab
    python examples/python/recipe_experiment.py exp.yaml --context=prod

tallyd is reached as tallyctl reaches it: TALLY_CONTROLLER, TALLY_TOKEN,
TALLY_CA_CERT, or a context of ~/.config/tally/config.yaml. The demo's
experiment (examples/experiments/recipe-ab.yaml) trains on the corpus
`make demo` prepares, about two minutes on two CPU workers.
"""

import argparse
import os
import sys

import tally

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT = os.path.join(HERE, "..", "experiments", "recipe-ab.yaml")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("experiment", nargs="?", default=DEFAULT,
                        help="experiment file (default: the demo's recipe-ab.yaml)")
    parser.add_argument("--context", help="context of the tallyctl config file")
    args = parser.parse_args()
    try:
        with tally.Client.from_config(args.context) as client:
            exp = client.experiments.create(args.experiment)
            print(exp.name, flush=True)
            for event in client.experiments.watch(exp):
                print("#%-4d %-17s %s %s" % (event.sequence, event.type, event.variant,
                                             event.reason), flush=True)
            print()
            print(client.experiments.report(exp).table())
    except tally.TallyError as e:
        print("recipe_experiment: %s" % e, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
