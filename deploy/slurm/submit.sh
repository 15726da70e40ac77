#!/bin/bash
# One night's campaign: the array of shards, then the merge once every task ended.
#
#   deploy/slurm/submit.sh                              # settings: deploy/slurm/nightly.env
#   TORCHCHAOS_SETTINGS=~/nightly.env deploy/slurm/submit.sh
#
# Prints the two job ids; the merged report is in $RUNS_ROOT/campaign-<array id>/merged.
set -euo pipefail
recipes="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
settings="$(realpath "${TORCHCHAOS_SETTINGS:-$recipes/nightly.env}")"
# shellcheck source=/dev/null
source "$settings"
mkdir -p "$RUNS_ROOT"
common=(--export="ALL,TORCHCHAOS_SETTINGS=$settings,TORCHCHAOS_RECIPES=$recipes"
        --chdir="$RUNS_ROOT")
if [ -n "$PARTITION" ]; then common+=(--partition="$PARTITION"); fi
array=$(sbatch --parsable "${common[@]}" --array="0-$((TASKS - 1))" \
    --cpus-per-task="$CPUS_PER_TASK" --mem="$MEM" --time="$TIME" \
    "$recipes/campaign-array.sbatch")
array=${array%%;*}
merge=$(sbatch --parsable "${common[@]}" --dependency="afterany:$array" --time="$MERGE_TIME" \
    "$recipes/merge.sbatch" "$array")
echo "campaign: job $array (${TASKS} tasks), merge: job ${merge%%;*}"
