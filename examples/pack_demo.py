import longpack

result = longpack.PackConfig(demo=True, out="out/demo", overwrite=True).run()
print(result.counts)
