# Sourced by the ci/ scripts that need Debian packages (a fresh machine lacks many).
# install_debs PKG...: installs those not installed yet (apt-get update first), as
# root; says which it installs on stderr through the caller's `log`, and fails
# through the caller's `die` when not root.
install_debs() {
    local missing=() p
    for p in "$@"; do
        dpkg-query -W -f '${Status}' "$p" 2>/dev/null | grep -q "install ok installed" \
            || missing+=("$p")
    done
    [ ${#missing[@]} -gt 0 ] || return 0
    [ "$(id -u)" = 0 ] || die "missing Debian packages (run as root to install): ${missing[*]}"
    log "installing missing packages: ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q >&2
    apt-get install -y -q --no-install-recommends "${missing[@]}" >&2
}
