#compdef kcache

_kcache_completion() {
  eval $(env _TYPER_COMPLETE_ARGS="${words[1,$CURRENT]}" _KCACHE_COMPLETE=complete_zsh kcache)
}

if [[ $zsh_eval_context[-1] == loadautofunc ]]; then
  # autoloaded from fpath as _kcache: complete this TAB too
  _kcache_completion "$@"
else
  # sourced: register the function for later TABs
  compdef _kcache_completion kcache
fi
