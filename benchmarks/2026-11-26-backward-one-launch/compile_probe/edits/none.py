def edit(t):
    return t
