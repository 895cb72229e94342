# Sourced by the benchmarks (scripts/bench, scripts/bench-ab): runs a script
# as an ordinary user made for the run, as a desktop's programs run. Root's
# own run is the worst case of any check that looks at the processes of the
# caller's user (every process of the machine is root's).
#   as_ordinary_user WORK SCRIPT FILE...
# copies FILE... (programs, made executable, or directories: a build that
# copy_keychainfs laid out) and SCRIPT (run by bash from the directory
# holding them, its standard output returned) into WORK/as-user; the user,
# and everything it started, is removed when the script ends.
#   copy_keychainfs BINARY DIR
# lays out a release build's BINARY as DIR/bin/keychainfs, with its
# position-independent half, where it looks for it: DIR/libexec/keychainfs/
# keychainfs (docs/SECURITY.md, "Two builds of one program"; a build from
# before there were two has none, and needs none).
. "$(dirname "${BASH_SOURCE[0]}")/../build-layout.sh"
copy_keychainfs() {
    local binary=$1 dir=$2
    local half
    half=$(position_independent_half "$binary")
    install -D -m 0755 "$binary" "$dir/bin/keychainfs"
    if [ -x "$half" ]; then install -D -m 0755 "$half" "$dir/libexec/keychainfs/keychainfs"; fi
}
as_ordinary_user() {
    local work=$1 script=$2
    shift 2
    local user=kcfs-bench-$$-$RANDOM
    useradd --create-home --shell /bin/sh "$user"
    local shared=$work/as-user
    mkdir -p -m 755 "$shared"
    chmod 711 "$work"
    local file
    for file in "$@"; do cp -r "$file" "$shared/"; done
    chmod -R a+rX "$shared"
    find "$shared" -maxdepth 1 -type f -exec chmod 755 {} +
    cp "$script" "$shared/run.sh"
    chmod 644 "$shared/run.sh"
    su "$user" -s /bin/bash -c "cd '$shared' && bash ./run.sh" 2>/dev/null || true
    pkill -KILL -u "$user" 2>/dev/null || true
    userdel --remove "$user" 2>/dev/null || true
}
