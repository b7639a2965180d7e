_kcache_completion() {
    local IFS=$'
'
    COMPREPLY=( $( env COMP_WORDS="${COMP_WORDS[*]}" \
                   COMP_CWORD=$COMP_CWORD \
                   _KCACHE_COMPLETE=complete_bash $1 ) )
    if [[ $? == 3 ]]; then
        # a value of a closed set (a status, a sort key, an op of the cache) and none matches: no file names
        compopt +o default 2>/dev/null
    fi
    return 0
}

complete -o default -F _kcache_completion kcache
