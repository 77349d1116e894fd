"""Where the run's curves go: W&B through slime's own options when WANDB_API_KEY is set, TensorBoard otherwise.

slime at SLIME_COMMIT logs every rollout's and training step's metrics through `logging_utils.log`
(slime/utils/logging_utils.py l.45-51): to W&B with --use-wandb, to TensorBoard with --use-tensorboard, whose
writer puts its event files in $TENSORBOARD_DIR when set (slime/utils/tensorboard_utils.py l.34-44), else in a
relative tensorboard_log/ folder. The in-job gate adds the learning signal (reward mean and spread, zero-advantage
share, trainable tokens per group, tokens per rollout, the gate's counters) to the same metrics
(polarstack.train.learning_signal); slime's own include train/loss, train/kl_loss, train/grad_norm, rollout/zero_std/*.
- W&B: `--use-wandb --wandb-project polarstack --wandb-group <run>`; never `--wandb-key` (slime l.40-41 would log
  in with a key on the command line, in the dry run, launch.sh and Ray's job). wandb reads WANDB_API_KEY from the
  environment the trainer container got at `make up` (compose.yaml passes it through, no value in any file or
  image), which Ray's workers inherit from the Ray head started in that container (Ray's behaviour, not checked
  here; on the node, the job's W&B run appearing confirms it); the key is named, never copied, here. No agent
  session gets it: Polar starts them with --cleanenv (POLAR_APPTAINER_CLEANENV, polarstack.stack.assets).
- TensorBoard: TENSORBOARD_DIR=<model.save>/tensorboard/<run>, under the checkpoints volume, set in the Ray job's
  runtime env; `make tensorboard` is not provided: docs/preflight.md ("Curves") says how to open the files.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

WANDB_KEY_ENV = "WANDB_API_KEY"
PROJECT = "polarstack"


def tracker_for(
    run_name: str, save_root: str, env: Mapping[str, str] | None = None
) -> tuple[str, list[str], dict[str, str]]:
    """(tracker, train_async.py arguments, runtime-env variables) for one run; never the key's value."""
    env = os.environ if env is None else env
    if env.get(WANDB_KEY_ENV):
        return "wandb", ["--use-wandb", "--wandb-project", PROJECT, "--wandb-group", run_name], {}
    directory = f"{save_root}/tensorboard/{run_name}"
    args = ["--use-tensorboard", "--tb-project-name", PROJECT, "--tb-experiment-name", run_name]
    return "tensorboard", args, {"TENSORBOARD_DIR": directory}


__all__ = ["tracker_for", "WANDB_KEY_ENV"]
