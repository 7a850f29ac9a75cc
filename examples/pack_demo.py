import longpack

result = longpack.PackConfig(demo=True, out="out/demo").run()
print(result.counts, result.out)  # samples read / packed / dropped, and the output folder
