"""Static analysis of submitted sources: the rule table (rules.py) and the AST scanner (scanner.py)."""
