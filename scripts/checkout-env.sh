# Sourced by the GPU scripts: `import shardbench` from this checkout without installing it (the
# GPU image has no network, and its python is not ours to change).
#
# An install maps bench/ to the package `shardbench` and models/ to `shardbench.models`
# (pyproject.toml); here a temporary folder holds that layout as symlinks and goes first on
# PYTHONPATH, which every rank inherits. Wheels the image lacks (the 'peers' extra, built by
# scripts/gpu-wheels.sh on a machine with a network) are installed into the same folder from
# ${SHARDBENCH_WHEELS:-wheels}/ when it exists: no index, no dependencies resolved.
_checkout=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
SHARDBENCH_IMPORT_DIR=$(mktemp -d "${TMPDIR:-/tmp}/shardbench-import.XXXXXX")
mkdir "$SHARDBENCH_IMPORT_DIR/shardbench"
for _entry in "$_checkout"/bench/*; do
    ln -s "$_entry" "$SHARDBENCH_IMPORT_DIR/shardbench/"
done
ln -s "$_checkout/models" "$SHARDBENCH_IMPORT_DIR/shardbench/models"
_wheels=${SHARDBENCH_WHEELS:-$_checkout/wheels}
if compgen -G "$_wheels/*.whl" >/dev/null; then
    python3 -m pip install --quiet --no-index --no-deps --target "$SHARDBENCH_IMPORT_DIR" "$_wheels"/*.whl ||
        echo "checkout-env: could not install the wheels in $_wheels; peers stay unavailable" >&2
fi
export PYTHONPATH="$SHARDBENCH_IMPORT_DIR${PYTHONPATH:+:$PYTHONPATH}"
unset _checkout _entry _wheels
