"""What the Cubed and Dask front ends share: the plan IR builder (`ir`), the symbols it builds
from (`symbols`), the stored arrays behind a front end's array (`stored`, `decoding`), basic
selections (`selection`) and store URLs (`urls`). Nothing here imports a front end."""
