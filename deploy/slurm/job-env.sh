# Sourced by every job of the nightly: its settings, its Python environment, torchchaos.
# shellcheck source=/dev/null
source "${TORCHCHAOS_SETTINGS:?submit the nightly with deploy/slurm/submit.sh}"
if [ -n "${TORCHCHAOS_VENV:-}" ]; then
    source "$TORCHCHAOS_VENV/bin/activate" || exit 2
fi
if [ -z "$(command -v torchchaos)" ]; then
    echo "torchchaos: error: torchchaos is not on this node's PATH (set TORCHCHAOS_VENV in" \
         "$TORCHCHAOS_SETTINGS to the environment it is installed in)" >&2
    exit 2
fi
