# Sourced by scripts/build, scripts/package and the benchmarks' helpers:
# where a release build's position-independent half lies, by the rule the
# command itself follows (ExecutableImage.positionIndependentBuild):
# libexec/keychainfs/keychainfs beside the directory BINARY really is in
# (.build/release is a link). docs/SECURITY.md, "Two builds of one program".
#   position_independent_half BINARY
position_independent_half() {
    echo "$(dirname "$(realpath "$1")")/../libexec/keychainfs/keychainfs"
}
