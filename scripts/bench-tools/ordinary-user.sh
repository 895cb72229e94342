# Sourced by the benchmarks (scripts/bench, scripts/bench-ab): runs a script
# as an ordinary user made for the run, as a desktop's programs run. Root's
# own run is the worst case of any check that looks at the processes of the
# caller's user (every process of the machine is root's).
#   as_ordinary_user WORK SCRIPT FILE...
# copies FILE... (programs, made executable) and SCRIPT (run by bash from
# the directory holding them, its standard output returned) into WORK/as-user;
# the user, and everything it started, is removed when the script ends.
as_ordinary_user() {
    local work=$1 script=$2
    shift 2
    local user=kcfs-bench-$$-$RANDOM
    useradd --create-home --shell /bin/sh "$user"
    local shared=$work/as-user
    mkdir -p -m 755 "$shared"
    chmod 711 "$work"
    local file
    for file in "$@"; do cp "$file" "$shared/"; done
    chmod 755 "$shared"/*
    cp "$script" "$shared/run.sh"
    chmod 644 "$shared/run.sh"
    su "$user" -s /bin/bash -c "cd '$shared' && bash ./run.sh" 2>/dev/null || true
    pkill -KILL -u "$user" 2>/dev/null || true
    userdel --remove "$user" 2>/dev/null || true
}
