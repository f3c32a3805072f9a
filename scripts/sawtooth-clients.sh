#!/bin/sh
# Builds Sawtooth's own CLIs (sawtooth, sawset from sawtooth-core's cli/;
# intkey from sawtooth-sdk-python's examples/intkey_python) into a Python 3.8
# virtualenv, for tests/acceptance/test_sawtooth_own_clients.py.
#
#   sh scripts/sawtooth-clients.sh SAWTOOTH_CORE SAWTOOTH_SDK_PYTHON TARGET
#
# The two sources are checkouts of those repositories: the CLIs are on no
# package index. Everything else (sawtooth-sdk, sawtooth-signing, protobuf,
# grpcio-tools) comes from the package index. PYTHON38 names the interpreter
# (default python3.8, else pyenv's 3.8), the Python these CLIs and their
# protobuf 3 dependencies were released for.
# The sources are copied under TARGET/src first, as their build writes into
# the tree (generated protobuf modules, egg-info).
set -eu

CORE=${1:-${SAWTOOTH_CORE:-}}
SDK=${2:-${SAWTOOTH_SDK_PYTHON:-}}
TARGET=${3:-${SAWTOOTH_CLIENTS:-.sawtooth-clients}}
PYTHON38=${PYTHON38:-python3.8}
if ! "$PYTHON38" -c '' 2>/dev/null && command -v pyenv >/dev/null; then
    PYTHON38="$(pyenv prefix 3.8 2>/dev/null)/bin/python"
fi

if [ ! -f "$CORE/cli/setup.py" ] || [ ! -f "$SDK/examples/intkey_python/setup.py" ]; then
    echo "usage: $0 SAWTOOTH_CORE SAWTOOTH_SDK_PYTHON [TARGET]" >&2
    echo "  (checkouts of hyperledger/sawtooth-core and hyperledger/sawtooth-sdk-python)" >&2
    exit 2
fi

"$PYTHON38" -m venv "$TARGET"
TARGET=$(cd "$TARGET" && pwd)
PIP="$TARGET/bin/python -m pip --quiet"
# grpcio-tools 1.48 is the last release whose protoc output runs on protobuf 3.
$PIP install 'setuptools<70' wheel 'protobuf>=3.20,<3.21' 'grpcio-tools>=1.48,<1.49' \
    sawtooth-sdk sawtooth-signing

rm -rf "$TARGET/src"
mkdir -p "$TARGET/src"
cp -R "$CORE" "$TARGET/src/sawtooth-core"
cp -R "$SDK" "$TARGET/src/sawtooth-sdk-python"
(cd "$TARGET/src/sawtooth-core" && "$TARGET/bin/python" bin/protogen)
$PIP install --no-build-isolation "$TARGET/src/sawtooth-core/cli" \
    "$TARGET/src/sawtooth-sdk-python/examples/intkey_python"

for command in sawtooth sawset intkey; do
    "$TARGET/bin/$command" --help >/dev/null
done
echo "$TARGET/bin: sawtooth, sawset, intkey"
