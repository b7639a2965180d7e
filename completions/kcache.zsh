#compdef kcache

_kcache_completion() {
  eval $(env _TYPER_COMPLETE_ARGS="${words[1,$CURRENT]}" _KCACHE_COMPLETE=complete_zsh kcache)
}

compdef _kcache_completion kcache
if [[ $zsh_eval_context[-1] == loadautofunc ]]; then
  # autoloaded from fpath as _kcache on the first TAB of a shell: complete this TAB too
  _kcache_completion "$@"
fi
