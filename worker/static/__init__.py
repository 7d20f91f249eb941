"""Static analysis of submitted sources.

rules.py (the rule table and findings), patterns.py (the name tables each rule matches), names.py (import
alias resolution), cache_keys.py (cross-call containers and their keys), environment.py (environment
sniffing), foreign_code.py (code that is not the scanned Python), scanner.py (the AST walk over one file),
kernelguard_rules.py (kernelguard from PyPI as a second rule source, run in its own process).
"""
