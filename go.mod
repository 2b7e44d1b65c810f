module github.com/gpualloc/allocsim

go 1.26.8
