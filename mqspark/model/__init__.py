"""TODO package docstring"""
