LOADS: list[int] = []  # one entry per initialize, across every fresh load of group_state.py
