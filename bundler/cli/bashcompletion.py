"""The bash completion script ``ocistage --show-completion bash`` prints (and
``--install-completion`` installs): typer's, taught that image references hold a ``:``.

bash splits the words it hands a completion function at the characters of
``COMP_WORDBREAKS``, ``:`` and ``=`` among them by default, so ``ocistage pull
docker.io/library/alpine:3`` reaches typer's script as ``... alpine : 3`` and no cached
reference matches ``3``. As git's completion does (``__git_reorder_ltrim_colon_completions``
and ``_get_comp_words_by_ref -n :``), this script splits the line up to the cursor at white space
only, asks ``ocistage`` for the candidates of that word, and takes from each candidate the part
up to the word's last ``:``, which bash keeps in front of what it replaces. The protocol to
``ocistage`` is typer's (``COMP_WORDS``, ``COMP_CWORD``, ``_OCISTAGE_COMPLETE=complete_bash``).

typer (pinned below 0.29 in pyproject.toml) keeps the script in two places, the one
``--show-completion``/``--install-completion`` print and the one its completion class sources;
:func:`use` sets both, once, when the command line is built. The script is a ``%``
template (typer fills ``%(prog_name)s`` and its kin): a ``%`` of bash's own is written ``%%``.
tests/bundler/test_cli_completion.py runs the printed script in bash with the words bash makes.
"""

from __future__ import annotations

BASH_SCRIPT = r"""
%(complete_func)s() {
    local IFS=$'\n' cur
    local -a words
    if [[ -n ${COMP_LINE+set} ]]; then
        # the words as the user sees them: split at white space only, not at COMP_WORDBREAKS
        local line=${COMP_LINE:0:COMP_POINT}
        IFS=$' \t\n' read -r -a words <<< "$line"
        if [[ ${#words[@]} -eq 0 || $line == *[[:space:]] ]]; then
            words+=("")
        fi
    else  # called by hand, not by bash's completion: its words as given
        words=("${COMP_WORDS[@]:0:COMP_CWORD+1}")
    fi
    cur=${words[${#words[@]}-1]}
    COMPREPLY=( $( env COMP_WORDS="${words[*]}" \
                   COMP_CWORD=$(( ${#words[@]} - 1 )) \
                   %(autocomplete_var)s=complete_bash $1 ) )
    # bash replaces only what follows the word's last ':' (it is a word break)
    if [[ $cur == *:* && $COMP_WORDBREAKS == *:* ]]; then
        local colon=${cur%%"${cur##*:}"}
        COMPREPLY=( "${COMPREPLY[@]#"$colon"}" )
    fi
    return 0
}

complete -o default -F %(complete_func)s %(prog_name)s
"""


def use() -> None:
    """Make :data:`BASH_SCRIPT` typer's bash completion script."""
    from typer import _completion_classes, _completion_shared

    _completion_shared._completion_scripts["bash"] = BASH_SCRIPT
    _completion_classes.BashComplete.source_template = BASH_SCRIPT
